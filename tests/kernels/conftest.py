"""Kernel tests: the Triton interpreter on CPU tensors by default, the GPU with MINFER_TEST_DEVICE=cuda.

TRITON_INTERPRET has to be in the environment before triton is first imported (triton.jit
decides at decoration time), so it is set here, at collection, unless the run targets CUDA. If
some earlier module already imported the kernels compiled, the run stops with a clear error
rather than failing every test on CPU tensors.

Every test draws its random inputs from the `gen` fixture, seeded with the run's fixed seed
(tests/conftest.py: DEFAULT_SEED, or --seed / MINFER_TEST_SEED=<seed> for others); a failing
test's report names the seed.
"""

from __future__ import annotations

import os

import pytest

DEVICE = os.environ.get("MINFER_TEST_DEVICE", "cpu")
if DEVICE != "cuda":
    os.environ.setdefault("TRITON_INTERPRET", "1")

import torch  # noqa: E402

from minfer.kernels.triton._common import interpreting  # noqa: E402

if DEVICE != "cuda" and not interpreting():
    raise pytest.UsageError(
        "triton kernels were imported before TRITON_INTERPRET=1 was set; "
        "set it in tests/conftest.py (or the environment) for CPU kernel tests"
    )


def pytest_collection_modifyitems(config, items):
    """The interpreter computes with numpy, which warns on inf/NaN arithmetic that the tests feed
    on purpose (random scale bits, overflowing converts); those warnings are noise here."""
    here = os.path.dirname(__file__)
    noise = "ignore:(invalid value|overflow|divide by zero) encountered:RuntimeWarning"
    quiet = pytest.mark.filterwarnings(noise)
    for item in items:
        if str(item.path).startswith(here):
            item.add_marker(quiet)


@pytest.fixture(scope="session")
def device() -> torch.device:
    if DEVICE == "cuda" and not torch.cuda.is_available():
        pytest.fail("MINFER_TEST_DEVICE=cuda but torch sees no CUDA device")
    return torch.device(DEVICE)


@pytest.fixture
def gen(test_seed) -> torch.Generator:
    """A CPU generator seeded with the run's seed (tests/conftest.py: fixed unless --seed says otherwise)."""
    return torch.Generator().manual_seed(test_seed)


def poisoned(shape, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """An output buffer full of NaN (0xFF bytes for integer types), so unwritten elements show."""
    if dtype.is_floating_point:
        return torch.full(shape, float("nan"), dtype=dtype, device=device)
    return torch.full(shape, -1, dtype=dtype, device=device)


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    """||out - ref|| / ||ref|| in float64."""
    o, r = out.detach().cpu().double(), ref.detach().cpu().double()
    return float((o - r).norm() / r.norm())


def assert_same_values(out: torch.Tensor, ref: torch.Tensor) -> None:
    """Bit-for-bit equal, except that any NaN matches any NaN (payloads differ across devices)."""
    out, ref = out.detach().cpu(), ref.detach().cpu()
    assert out.dtype == ref.dtype and out.shape == ref.shape
    nan_out, nan_ref = torch.isnan(out), torch.isnan(ref)
    assert torch.equal(nan_out, nan_ref), f"NaN positions differ: {int((nan_out ^ nan_ref).sum())} elements"
    bits = {torch.float32: torch.int32, torch.float16: torch.int16, torch.bfloat16: torch.int16}[out.dtype]
    a, b = out[~nan_out].view(bits), ref[~nan_ref].view(bits)
    bad = (a != b).nonzero().flatten()
    assert bad.numel() == 0, (
        f"{bad.numel()} of {a.numel()} values differ; first at {int(bad[0])}: "
        f"{out[~nan_out][bad[0]].item()} vs {ref[~nan_ref][bad[0]].item()}"
    )


@pytest.fixture(scope="session")
def check():
    """The comparison helpers above, as one namespace for the test modules."""

    class Check:
        poisoned = staticmethod(poisoned)
        rel_err = staticmethod(rel_err)
        same_values = staticmethod(assert_same_values)

    return Check
