"""The kernels of every backend: Triton (cuda), WGSL (vulkan), C and torch (cpu), and the torch-only
launcher checks and sampling chain they share. Importing this package imports no Triton."""

from __future__ import annotations

from ..errors import DeviceError

INSTALL_TRITON = "pip install 'minfer[gpu]' (or: pip install triton)"


def triton_interpreting() -> bool:
    """Whether the cuda backend's Triton kernels run under Triton's CPU interpreter
    (TRITON_INTERPRET=1: host tensors, tests). DeviceError, one line saying what to install, when
    triton is not installed: the cuda backend needs it, the cpu and vulkan backends do not."""
    try:
        from .triton._common import interpreting
    except ImportError as e:
        if (e.name or "").split(".")[0] != "triton":
            raise
        raise DeviceError(f"device 'cuda' runs Triton kernels and triton is not installed: {INSTALL_TRITON}") from None
    return interpreting()
