"""The conformance harness: every registrable kernel against the torch reference under its own
contract (Triton interpreter on CPU; the GPU with MINFER_TEST_DEVICE=cuda), and proof that the
harness catches broken launchers."""

from __future__ import annotations

import textwrap

import pytest
import torch

from minfer.contracts.conformance import dtype_combinations, format_results, run_conformance
from minfer.contracts.parser import parse_file
from minfer.contracts.registry import KERNELS_DIR, contract_files, load_registry
from minfer.kernels.cpu import vnni as cpu_vnni

KERNELS = sorted(  # (the Vulkan contracts run on a wgpu adapter: tests/backends/test_wgpu_backend.py)
    s.kernel for f in contract_files() for s in parse_file(f).sections
    if s.registrable and s.backend != "Vulkan"
)
NUMPY_NOISE = "ignore:(invalid value|overflow|divide by zero) encountered:RuntimeWarning"
# the fused GEMVs (a GEMV with RoPE / SwiGLU / GeGLU in its store): their weight loops are the GEMV's
# (kernels/triton/gemv.py `_gemv_accumulate`), whose kernels run every type at every size here; so here each
# type once (sizes and layouts rotating) and every size and layout with the first: ~1/3.7 of the cases, ~100
# CPU-s of the suite. `python -m minfer.contracts.conformance` and the GPU runs keep every case.
COVERING = {"gemv_swiglu", "gemv_geglu", "gemv_rope"}


@pytest.mark.filterwarnings(NUMPY_NOISE)
@pytest.mark.parametrize("kernel", KERNELS)
def test_kernel_conforms_to_its_contract(kernel, registry, device, test_seed):
    if registry.kernels[kernel].contract.kernel_source == "c" and not cpu_vnni.available():
        pytest.skip("the C kernels need AVX512-VNNI and a C compiler")  # the cpu backend uses torch's then
    results, seed = run_conformance(registry, kernels=[kernel], device=device, seed=test_seed,
                                    covering=kernel in COVERING and device == "cpu")
    assert results, f"no case was generated for {kernel}"
    failed = [r for r in results if not r.passed]
    assert not failed, f"seed {seed}\n" + format_results(failed)
    sizes = {r.size for r in results}
    assert sizes == {"tiny", "odd", "boundary"}


C_KERNELS = sorted(
    s.kernel for f in contract_files() for s in parse_file(f).sections if s.registrable and s.kernel_source == "c"
)


@pytest.mark.filterwarnings(NUMPY_NOISE)
@pytest.mark.parametrize("isa", [i for i in cpu_vnni.ISAS if i != "avx512"])
@pytest.mark.parametrize("kernel", C_KERNELS)
def test_c_kernel_conforms_on_every_isa_build(kernel, isa, registry, device, test_seed):
    """The C kernels' AVX2 builds (MINFER_CPU_ISA=avx2 / avxvnni forced) under the same contracts."""
    with cpu_vnni.isa_forced(isa) as got:
        if got is None:
            pytest.skip(f"this CPU (or compiler) has no {isa} build")
        results, seed = run_conformance(registry, kernels=[kernel], device=device, seed=test_seed)
    assert results, f"no case was generated for {kernel}"
    failed = [r for r in results if not r.passed]
    assert not failed, f"seed {seed}\n" + format_results(failed)


def test_full_has_gemv_cases_above_the_int8_activation_threshold(registry):
    """The Q4 GEMV contracts declare 1e-4 for weights above Q8_MIN_WEIGHTS (x in two int8 passes; 1e-5
    is f32 x's): `--full` holds a case of each that takes that path, for every type it accepts (run
    compiled on the GPU: `python -m minfer.contracts.conformance --device cuda --full`; one takes minutes
    under the interpreter, so here only that the cases exist, are admitted and cross the threshold)."""
    from minfer.contracts.conformance import cases, prepare
    from minfer.contracts.harness import LARGE
    from minfer.kernels.triton.gemv import Q8_MIN_WEIGHTS, gemv_config

    gen = torch.Generator().manual_seed(0)
    for name in ("q4_0_gemv", "int4_gemv", "lut4_gemv", "gemv_swiglu", "gemv_rope"):
        k = registry.kernels[name]
        types = set()
        for case in cases(k, (LARGE,)):
            n, kk = case.setting.shapes["w"]
            assert n * kk > Q8_MIN_WEIGHTS and gemv_config(n, kk).q8 == 2, name
            types.add(case.dtypes["w"])
            assert prepare(k, case, gen) is not None, (name, case.label)
        assert types == set(next(i for i in k.contract.inputs if i.quant).quant.ggml_dtypes), name


def test_cases_cover_every_declared_dtype(registry):
    combos = dtype_combinations(registry.kernels["dequant"])
    assert len(combos) == 16 * 3  # every storage type x every output dtype with a tolerance
    swiglu = dtype_combinations(registry.kernels["swiglu"])
    assert [c[0] for c in swiglu] == [{"gate": d, "up": d} for d in ("F32", "F16", "BF16")]


BROKEN = '''
import torch

def add_wrong(x, y, out=None):
    out = torch.empty_like(x) if out is None else out
    return torch.sub(x, y, out=out)

def add_ignores_out(x, y, out=None):
    return x + y

def add_half_written(x, y, out=None):
    out = torch.empty_like(x) if out is None else out
    flat = out.view(-1)
    flat[: flat.numel() // 2] = (x + y).view(-1)[: flat.numel() // 2]
    return out

def add_wrong_dtype(x, y):  # no out= parameter: the harness checks the returned tensor
    return torch.add(x, y).double()

def add_writes_past_its_end(x, y, out=None):
    """Correct values, and one more element written after the output (an off-by-one bound)."""
    out = torch.empty_like(x) if out is None else out
    torch.add(x, y, out=out)
    torch.as_strided(out, (out.numel() + 1,), (1,))[-1] = 0.0
    return out

def add_clobbers_x(x, y, out=None):
    """Correct values, and its input x overwritten (scratch space it does not own)."""
    out = torch.empty_like(x) if out is None else out
    torch.add(x, y, out=out)
    x.zero_()
    return out

_calls = [0]

def add_noisy(x, y, out=None):
    """Correct values, but every other call bumps one element by one ulp: not bit-stable."""
    out = torch.empty_like(x) if out is None else out
    torch.add(x, y, out=out)
    _calls[0] += 1
    if _calls[0] % 2 == 0:
        flat = out.view(-1)
        flat[0] = torch.nextafter(flat[0], torch.tensor(float("inf")))
    return out
'''


@pytest.fixture
def broken_registry(tmp_path, monkeypatch):
    (tmp_path / "broken_kernels.py").write_text(textwrap.dedent(BROKEN))
    monkeypatch.syspath_prepend(str(tmp_path))
    text = (KERNELS_DIR / "triton" / "elementwise.fkc.md").read_text()
    head, rest = text.split("## add_f32", 1)
    section = "## add_f32" + rest.split("## mul_f32", 1)[0]
    sections = [
        section.replace("kernel: add_f32", f"kernel: {name}")
        .replace("minfer.kernels.triton.elementwise:add_f32", f"broken_kernels:{name}")
        .replace('kernel_source: "triton"', 'kernel_source: "torch"')
        for name in ("add_wrong", "add_ignores_out", "add_half_written", "add_wrong_dtype", "add_noisy",
                     "add_writes_past_its_end", "add_clobbers_x")
    ]
    path = tmp_path / "broken.fkc.md"
    path.write_text(head.replace('kernel_source: "triton"', 'kernel_source: "torch"') + "".join(sections))
    reg = load_registry([path], trusted=("broken_kernels",))  # (a file from anywhere could not name it)
    assert not any(reg.errors.values()), reg.errors
    return reg


@pytest.mark.parametrize(
    "kernel, message",
    [
        ("add_wrong", "relative error"),
        ("add_ignores_out", "ignored out="),
        ("add_half_written", "non-finite values"),
        ("add_wrong_dtype", "output dtype"),
        ("add_noisy", "declared bitwise but two runs differ"),
        ("add_writes_past_its_end", "outside its output (the guard regions"),
        ("add_clobbers_x", "x: "),
    ],
)
def test_harness_catches_broken_launchers(broken_registry, kernel, message, test_seed):
    results, _ = run_conformance(broken_registry, kernels=[kernel], device="cpu", seed=test_seed)
    assert any(message in r.message for r in results), format_results(results)
    if kernel != "add_noisy":  # (on cpu only the odd cases run twice)
        assert not any(r.passed for r in results), format_results(results)


BROKEN_ATTENTION = '''
from minfer.kernels.triton.attention import attention_rows

def attn_touches_the_extra_slot(**kw):
    """Right output; one byte of the slot no row attends changed (what a stray write does)."""
    out = attention_rows(**kw)
    kw["cache_k"][kw["layer"], -1, 0, 0] += 1
    return out

def attn_writes_one_position_behind(**kw):
    """k and v stored one position before each row's (the row then attends up to there)."""
    pos = kw["positions"]
    return attention_rows(**dict(kw, positions=(pos - 1).clamp(min=0).to(pos.dtype)))
'''


@pytest.mark.parametrize("kernel, message", [
    ("attn_touches_the_extra_slot", "elements changed that the op must not write"),
    ("attn_writes_one_position_behind", "cache_k: the elements written differ"),
])
def test_harness_checks_every_byte_of_the_kv_cache(tmp_path, monkeypatch, test_seed, kernel, message):
    """An attention kernel writes its rows' k and v into the cache and nothing else: the harness
    compares every byte of both caches after the launch (the rows written against k and v)."""
    (tmp_path / "broken_attention.py").write_text(textwrap.dedent(BROKEN_ATTENTION))
    monkeypatch.syspath_prepend(str(tmp_path))
    text = (KERNELS_DIR / "triton" / "attention.fkc.md").read_text()
    head, rest = text.split("## attention_rows (decode; any rows)", 1)
    section = "## attention_rows" + rest.split("## attention_rows_q8", 1)[0]
    section = section.replace("kernel: attention_rows", f"kernel: {kernel}").replace(
        "minfer.kernels.triton.attention:attention_rows", f"broken_attention:{kernel}")
    path = tmp_path / "broken_attention.fkc.md"
    path.write_text(head + section)
    reg = load_registry([path], trusted=("broken_attention",))
    assert not any(reg.errors.values()), reg.errors
    results, _ = run_conformance(reg, kernels=[kernel], device="cpu", seed=test_seed, sizes=("tiny",))
    assert results and all(message in r.message for r in results), format_results(results)
