"""Tracing: `TraceRecorder` records a run node by node (MINFER_TRACE=path.json); viz/ replays it.

See docs/TRACE-FORMAT.md for the file format and `minfer trace view FILE` for the viewer. The
recorder (torch, numpy) is imported on first use, so `minfer trace view` starts without them.
"""

from __future__ import annotations

__all__ = ["TraceRecorder"]


def __getattr__(name: str):
    if name == "TraceRecorder":
        from .recorder import TraceRecorder

        return TraceRecorder
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
