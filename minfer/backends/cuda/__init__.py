"""The cuda backend: the contracts' Triton / torch kernels on an NVIDIA GPU. backend.py
(CUDABackend: load, compile, launch), graphs.py (the captured decode and prompt-chunk CUDA graphs).
Under the Triton interpreter (TRITON_INTERPRET=1) the same backend runs on CPU tensors, for tests."""
