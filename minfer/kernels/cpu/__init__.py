"""The cpu backend's kernels: matmul.py (torch's int4 / float matmuls behind contracts), vnni.py
(the AVX512-VNNI C kernels of q4_vnni.c, built once by kernels/cbuild.py) and their contracts."""
