"""Launcher plumbing shared by the WGSL kernel families (one module per family beside this one,
each with its contract `<family>.fkc.md`; the shaders in `shaders/`).

Each launcher, like the Triton ones: (1) checks its invariants, (2) allocates or takes `out`,
(3) computes the workgroup grid and records the dispatch on the tensors' device (kernels/wgpu/
device.py; it runs at the next flush). Tensors are `VkTensor`s, device buffers the backend owns.

Given torch tensors instead (the conformance harness, tests), a launcher runs on the process's
default Vulkan device (`_host_bridge`): the inputs are uploaded, the kernel runs, the result comes
back as a torch tensor (into `out=` when given), and the caches an attention call writes are
copied back too.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable

import torch

from ...errors import UnsupportedError
from ...quant.types import GGMLType, by_name, quant_info
from ..wgpu.device import WGSL_DIR, VkTensor, default_device

SHADERS = tuple(sorted(WGSL_DIR.glob("*.wgsl")))  # each family's REVISION_SOURCES: an edit retires judge numbers
WG = 64  # invocations per workgroup of the elementwise kernels
MAX_GROUPS = 65535
QTYPES = {GGMLType.F32, GGMLType.F16, GGMLType.BF16, GGMLType.Q4_0, GGMLType.Q4_1, GGMLType.Q5_0, GGMLType.Q5_1,
          GGMLType.Q8_0, GGMLType.Q2_K, GGMLType.Q3_K, GGMLType.Q4_K, GGMLType.Q5_K, GGMLType.Q6_K, GGMLType.IQ4_NL,
          GGMLType.IQ4_XS, GGMLType.MXFP4}


def _host_bridge(mutates: tuple[str, ...] = ()) -> Callable:
    """Launchers also take torch tensors: upload them, run, download the result (into `out`); the
    inputs named in `mutates` are copied back into the caller's tensors."""

    def wrap(fn: Callable) -> Callable:
        @functools.wraps(fn)
        def launch(**kw):
            if not any(isinstance(v, torch.Tensor) for v in kw.values()):
                return fn(**kw)
            dev = default_device()
            out = kw.pop("out", None)
            dkw = {k: dev.upload(v) if isinstance(v, torch.Tensor) else v for k, v in kw.items()}
            res = dev.download(fn(**dkw))
            for name in mutates:
                if isinstance(kw.get(name), torch.Tensor):
                    kw[name].copy_(dev.download(dkw[name]).view(kw[name].dtype).view(kw[name].shape))
            if out is None:
                return res
            out.copy_(res.view(out.shape))
            return out

        launch.wgpu_device = default_device  # what the judge times this launcher's device calls on
        return launch

    return wrap


def _check(what: str, name: str, t, dtype: str, ndim: tuple[int, ...] | None = None, contiguous: bool = False) -> None:
    if not isinstance(t, VkTensor):
        raise UnsupportedError(f"{what}: {name} must be a device tensor, got {type(t).__name__}")
    if t.dtype != dtype:
        raise UnsupportedError(f"{what}: {name} must be {dtype}, got {t.dtype}")
    if ndim is not None and len(t.shape) not in ndim:
        raise UnsupportedError(f"{what}: {name} must have rank {' or '.join(map(str, ndim))}, got {t.shape}")
    if contiguous and not t.contiguous:
        raise UnsupportedError(f"{what}: {name} must be contiguous")


def _out(what: str, out, like: VkTensor, shape: tuple[int, ...], dtype: str = "F32") -> VkTensor:
    if out is None:
        return like.dev.empty(shape, dtype)
    _check(what, "out", out, dtype, contiguous=True)
    if out.numel != math.prod(shape):
        raise UnsupportedError(f"{what}: out must hold {shape}, got {out.shape}")
    return out


def _rows(t: VkTensor) -> int:
    return t.shape[0] if len(t.shape) == 2 else 1


def _grid_2d(n: int, per_group: int) -> tuple[int, int]:
    """Workgroups (x, y) covering n items of per_group each, x below the 65535 limit."""
    groups = -(-n // per_group)
    y = -(-groups // MAX_GROUPS)
    return -(-groups // y), y


def _qinfo(what: str, qtype):
    q = by_name(qtype) if isinstance(qtype, str) else quant_info(qtype)
    if q.type not in QTYPES:
        raise UnsupportedError(f"{what}: storage type {q.name} has no WGSL decoder (have: "
                               f"{', '.join(sorted(t.name for t in QTYPES))})")
    return q


def _at(out: VkTensor) -> VkTensor:
    """Kernels that write from element 0 of their output binding need an unshifted buffer."""
    if out.offset:
        raise UnsupportedError("vk: this kernel writes its output from element 0 (out= must not be a shifted view)")
    return out
