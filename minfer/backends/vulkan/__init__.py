"""The vulkan backend (devices `vulkan` and `gpu`): the contracts' WGSL kernels through wgpu.
backend.py (WGPUBackend: load, compile, launch), replay.py (the captured decode step, replayed)."""
