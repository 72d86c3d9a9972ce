"""The cpu backend: torch on the host, the numerical reference. backend.py (CPUBackend), ops.py
(the per-op torch references the other backends reuse: RoPE tables, ...), weights.py (each
matrix's kernel and prepared layout, picked through the cpu contracts)."""
