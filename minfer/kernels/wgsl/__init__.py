"""The vulkan backend's kernels: WGSL shaders (`shaders/`) and their launchers, one module per
kernel family with its contract beside it (`<family>.fkc.md`); _common.py holds the launcher
plumbing. They run on the wgpu device runtime (kernels/wgpu/). No Triton anywhere here."""
