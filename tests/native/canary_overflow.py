"""Not collected by the suite (no test_ prefix): scripts/sanitize.sh runs it to show that the
sanitized build is live. The call reads one element past a numpy buffer (malloc'd, so ASan's
red zones surround it): under ASan the process must abort with a heap-buffer-overflow report."""

from __future__ import annotations

import ctypes

import numpy as np

from minfer.kernels.wgpu import device as wgpu_device

NOOP_PIPE = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p)(lambda *a: None)
NOOP_GROUP = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_uint32, ctypes.c_void_p, ctypes.c_size_t,
                              ctypes.c_void_p)(lambda *a: None)
NOOP_DISPATCH = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_uint32, ctypes.c_uint32, ctypes.c_uint32)(
    lambda *a: None)


def test_overflow_is_caught():
    so = wgpu_device._replay_library()
    assert so is not None
    n = 64
    ptrs = np.arange(1, n + 1, dtype=np.uintp)
    offsets = np.zeros(n, dtype=np.uint32)
    grid = np.ones(3 * (n - 1), dtype=np.uint32)  # one dispatch short: the last grid read is past the end
    fns = [ctypes.cast(f, ctypes.c_void_p) for f in (NOOP_PIPE, NOOP_GROUP, NOOP_DISPATCH)]
    so.minfer_replay(None, n, ptrs.ctypes.data, ptrs.ctypes.data, offsets.ctypes.data, grid.ctypes.data, *fns)
