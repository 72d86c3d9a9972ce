"""The cuda backend's kernels: Triton, one module per kernel family with its contract beside it
(`<family>.fkc.md`), plus torch_ops.py (cuBLAS / SDPA declared as kernels). _common.py holds the
launcher plumbing and jit helpers the families share. Importing this package imports no Triton;
its modules do."""
