"""Backends: where a compiled graph runs. `create_backend(config)` is the one factory.

- `cpu`: torch on the host, the numerical reference (cpu/: backend.py, ops.py, weights.py).
- `cuda`: the contracts' kernels on an NVIDIA GPU, CUDA-graph decode (cuda/: backend.py, graphs.py); under the Triton
  interpreter (TRITON_INTERPRET=1) the same backend runs on CPU tensors, for tests.
- `vulkan` / `gpu`: the contracts' WGSL kernels through wgpu (vulkan/: backend.py, replay.py): a Vulkan adapter, or
  whatever adapter wgpu finds (Metal on macOS); Mesa's lavapipe on a machine with no GPU.

Every backend shares the compiled plan (plan.py) and owns its KV cache (kv_cache.py).
"""

from __future__ import annotations

from ..config import EngineConfig
from ..errors import DeviceError
from .base import Backend, Batch, SeqSpan

__all__ = ["Backend", "Batch", "SeqSpan", "create_backend", "DEVICES"]

DEVICES = ("cpu", "cuda", "vulkan", "gpu")


def create_backend(config: EngineConfig, comm=None, plan_only: bool = False) -> Backend:
    """The backend for `config.device`. No fallback: an unavailable device is a DeviceError.
    `comm` (parallel/comm.py): this rank's communicator, for a tensor-parallel graph. `plan_only`:
    a backend that only picks kernels at load (`minfer plan`; cpu and cuda)."""
    if config.device == "cpu":
        from .cpu.backend import CPUBackend

        return CPUBackend(config, comm=comm, plan_only=plan_only)
    if config.device == "cuda":
        import torch

        from ..kernels import triton_interpreting  # DeviceError when triton is not installed

        if not plan_only and not triton_interpreting() and not torch.cuda.is_available():
            raise DeviceError("device 'cuda' requested but no CUDA GPU is visible to torch; use --device cpu")
        from .cuda.backend import CUDABackend

        return CUDABackend(config, comm=comm, plan_only=plan_only)
    if config.device in ("vulkan", "gpu"):
        if plan_only:
            raise DeviceError("minfer plan: the vulkan backend picks its kernels on a device only")
        from .vulkan.backend import WGPUBackend  # DeviceError when wgpu or an adapter is missing

        return WGPUBackend(config, comm=comm)
    raise DeviceError(f"unknown device {config.device!r}; available: {', '.join(DEVICES)}")
