"""The wgpu device runtime the WGSL kernels run on: device.py (adapter, device tensors, pipelines,
dispatch recording, captured-step replay) and replay.c (the replay encoder, built once by
kernels/cbuild.py)."""
