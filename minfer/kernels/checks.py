"""Launcher checks in torch only: what every launcher verifies before it allocates and launches.

Each kernel family states *what* it requires in one line and every failure reads the same way:
the launcher's name, what was expected, what was found. Invariant failures raise
UnsupportedError (DeviceError for tensors on the wrong or on different devices), never a bare
ValueError and never a crash inside a kernel.

This module imports no Triton: the kernels written in torch (`sample.sample_rows`, which the
vulkan backend runs on the host) use it on machines without Triton. `same_device` accepts any
one device; the Triton launchers add the device their kernels compile for
(`_common.check_device`: cuda, or cpu under the interpreter).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ..errors import DeviceError, UnsupportedError


def check_tensor(
    what: str,
    name: str,
    t: object,
    dtypes: Sequence[torch.dtype],
    ndim: int | Sequence[int] | None = None,
) -> torch.Tensor:
    """`t` must be a contiguous torch tensor of one of `dtypes` (and of rank `ndim` if given)."""
    if not isinstance(t, torch.Tensor):
        raise UnsupportedError(f"{what}: {name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dtype not in dtypes:
        allowed = ", ".join(str(d).removeprefix("torch.") for d in dtypes)
        found = str(t.dtype).removeprefix("torch.")
        raise UnsupportedError(f"{what}: {name} must have dtype {allowed}, got {found}")
    if ndim is not None:
        ranks = (ndim,) if isinstance(ndim, int) else tuple(ndim)
        if t.dim() not in ranks:
            wanted = " or ".join(map(str, ranks))
            raise UnsupportedError(f"{what}: {name} must have rank {wanted}, got {t.dim()}")
    if not t.is_contiguous():
        layout = f"shape {tuple(t.shape)}, strides {t.stride()}"
        raise UnsupportedError(f"{what}: {name} must be contiguous ({layout})")
    return t


def rows_view(what: str, name: str, x: torch.Tensor, width: int | None = None) -> torch.Tensor:
    """`x` as [rows, width] with contiguous rows (any row stride): a 2-D tensor whose last dim has
    stride 1, e.g. a column slice of a wider activation."""
    if not isinstance(x, torch.Tensor):
        raise UnsupportedError(f"{what}: {name} must be a torch.Tensor, got {type(x).__name__}")
    if x.dim() == 1:
        x = x.view(1, -1)
    if x.dim() != 2 or (x.shape[1] > 1 and x.stride(1) != 1) or (x.shape[0] > 1 and x.stride(0) < x.shape[1]):
        raise UnsupportedError(f"{what}: {name} must be [rows, width] with contiguous rows, got shape "
                               f"{tuple(x.shape)} strides {x.stride()}")
    if width is not None and x.shape[1] != width:
        raise UnsupportedError(f"{what}: {name} must have {width} columns, got {x.shape[1]}")
    return x


def check_int(what: str, name: str, value: object, minimum: int = 0) -> int:
    """`value` must be a Python int (not a bool) of at least `minimum`."""
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise UnsupportedError(f"{what}: {name} must be an int >= {minimum}, got {value!r}")
    return value


def same_device(what: str, **tensors: torch.Tensor | None) -> torch.device:
    """The one device all given tensors are on (None entries skipped); DeviceError if they differ.

    Any device is accepted: this is the whole device check of a kernel written in torch, which
    runs wherever torch does (the Triton launchers add theirs: `_common.check_device`)."""
    present = {name: t for name, t in tensors.items() if t is not None}
    if not present:
        raise UnsupportedError(f"{what}: no tensor given to find the device of")
    devices = {t.device for t in present.values()}
    if len(devices) > 1:
        found = ", ".join(f"{name} on {t.device}" for name, t in present.items())
        raise DeviceError(f"{what}: all tensors must be on one device, found {found}")
    return devices.pop()


def make_out(
    what: str, out: torch.Tensor | None, shape: Sequence[int], dtype: torch.dtype, device: torch.device
) -> torch.Tensor:
    """`out` checked against (shape, dtype, device, contiguous), or a fresh tensor of that spec."""
    shape = tuple(int(s) for s in shape)
    if out is None:
        return torch.empty(shape, dtype=dtype, device=device)
    check_tensor(what, "out", out, (dtype,))
    if tuple(out.shape) != shape:
        raise UnsupportedError(f"{what}: out must have shape {shape}, got {tuple(out.shape)}")
    if out.device != device:
        raise DeviceError(f"{what}: out must be on {device}, got {out.device}")
    return out


def view_as(what: str, raw: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The flat bytes of `raw` reinterpreted as `dtype` (no copy); refused if misaligned."""
    flat = raw.reshape(-1)
    try:
        return flat.view(dtype)
    except RuntimeError as e:
        raise UnsupportedError(f"{what}: cannot read the bytes as {dtype} in place: {e}") from None
