"""TraceRecorder: records a run node by node and writes one JSON trace file (docs/TRACE-FORMAT.md).

The engine calls, in order: `set_graph(nodes)` once, then per forward pass `begin_step`, `node(...)`
after every node executes, `end_step(token, logits)`, and finally `close()`. `MINFER_TRACE=path`
makes the engine build one of these.

What it keeps, and why the file stays small (a 128-token run of a 30-layer model is ~10 MB):
- every node of every step: seconds, output shape, exact stats (min/max/mean/std/NaN/Inf), stored
  as one column per field per step;
- value heatmaps (<= heatmap_max^2 uint8 cells each) only at "heatmap steps": the first
  `heatmap_first` steps and every `heatmap_every`-th step after, and only while the heatmaps
  written so far stay under `heatmap_budget` bytes (dropped ones are counted);
- per step with logits: the chosen token, top-k tokens with probabilities, entropy.
"""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import torch

from ..errors import MinferError
from .format import FORMAT, VERSION
from .stats import distribution, heatmap, host_array, tensor_stats

_NODE_KEYS = ("id", "name", "op", "inputs", "shape", "dtype", "layer", "kernel")
_COLUMNS = ("id", "seconds", "shape", "numel", "min", "max", "mean", "std", "nan", "inf")


def _num(v: float | None) -> float | None:
    """JSON has no NaN/Inf: non-finite numbers are written as null."""
    return v if v is not None and math.isfinite(v) else None


def _check_node(d: object, i: int) -> dict:
    if not isinstance(d, dict):
        raise MinferError(f"trace: graph node #{i} is a {type(d).__name__}, expected a dict")
    missing = [k for k in _NODE_KEYS if k not in d]
    if missing:
        raise MinferError(f"trace: graph node #{i} lacks {', '.join(missing)}")
    if not isinstance(d["id"], int) or d["id"] < 0:
        raise MinferError(f"trace: graph node #{i} has id {d['id']!r}, expected an int >= 0")
    node = dict(d)
    try:
        node["inputs"] = [int(j) for j in d["inputs"]]
        node["shape"] = [s if isinstance(s, str) else int(s) for s in d["shape"]]  # str: a symbolic dim
        node["layer"] = None if d["layer"] is None else int(d["layer"])
    except (TypeError, ValueError) as e:
        raise MinferError(f"trace: graph node #{i} ({d['name']!r}): bad inputs/shape/layer: {e}") from None
    node["name"], node["op"], node["dtype"] = str(d["name"]), str(d["op"]), str(d["dtype"])
    node["kernel"] = None if d["kernel"] is None else str(d["kernel"])
    return node


class _Step:
    """The columns of one step being recorded."""

    def __init__(self, step: int, kind: str, n_tokens: int, heatmaps: bool):
        self.step, self.kind, self.n_tokens, self.heatmap_step = step, kind, n_tokens, heatmaps
        self.t0 = time.perf_counter()
        self.cols: dict[str, list] = {k: [] for k in _COLUMNS}
        self.kernels: dict[str, str] = {}
        self.heatmaps: dict[str, dict] = {}
        self.tokens: list[dict] = []  # one {seq, token, entropy, top} per sequence that sampled

    def finish(self, token: dict | None, entropy: float | None, top: dict | None) -> dict:
        return {
            "step": self.step, "kind": self.kind, "n_tokens": self.n_tokens,
            "seconds": time.perf_counter() - self.t0,
            "nodes": self.cols, "kernels": self.kernels,
            "heatmap_step": self.heatmap_step, "heatmaps": self.heatmaps,
            "token": token, "entropy": entropy, "top": top, "tokens": self.tokens,
        }


class TraceRecorder:
    """Records graph, per-node tensor statistics and per-step token distributions of one run."""

    def __init__(
        self,
        path: str | os.PathLike,
        *,
        heatmap_max: int = 64,
        top_k: int = 10,
        model_info: dict | None = None,
        heatmap_first: int = 4,
        heatmap_every: int = 8,
        heatmap_budget: int = 8_000_000,
        detokenize: Callable[[int], str] | None = None,
    ):
        """`detokenize(id) -> str`, when given, labels the top-k tokens in the viewer."""
        if heatmap_max < 1 or top_k < 1 or heatmap_every < 1 or heatmap_first < 0 or heatmap_budget < 0:
            raise MinferError("trace: heatmap_max, top_k and heatmap_every must be >= 1, "
                              "heatmap_first and heatmap_budget >= 0")
        self.path = Path(path)
        self._check_writable()  # now, not after the run it records
        self.settings = {"heatmap_max": heatmap_max, "top_k": top_k, "heatmap_first": heatmap_first,
                         "heatmap_every": heatmap_every, "heatmap_budget": heatmap_budget}
        self.model_info = dict(model_info or {})
        self.detokenize = detokenize
        self.graph: list[dict] = []
        self.kernel_of: dict[int, str | None] = {}
        self.steps: list[dict] = []
        self.heatmap_bytes = 0
        self.heatmaps_dropped = 0
        self._cur: _Step | None = None
        self._closed = False

    # -- engine API -------------------------------------------------------------------------------

    def set_graph(self, nodes: list[dict]) -> None:
        """The graph's nodes (id, name, op, inputs, shape, dtype, layer, kernel; extra keys kept)."""
        self._check_open()
        graph = [_check_node(d, i) for i, d in enumerate(nodes)]
        ids = [n["id"] for n in graph]
        if len(set(ids)) != len(ids):
            raise MinferError("trace: graph node ids are not unique")
        known = set(ids)
        for n in graph:
            bad = [j for j in n["inputs"] if j not in known]
            if bad:
                raise MinferError(f"trace: node {n['id']} ({n['name']}) has unknown inputs {bad}")
        self.graph = graph
        self.kernel_of = {n["id"]: n["kernel"] for n in graph}

    def begin_step(self, step: int, kind: str, n_tokens: int) -> None:
        """Start a forward pass. An unfinished previous step is closed without a token."""
        self._check_open()
        if kind not in ("prefill", "decode", "mixed"):
            raise MinferError(f"trace: step kind {kind!r}, expected 'prefill', 'decode' or 'mixed'")
        if step < 0 or n_tokens < 0:
            raise MinferError(f"trace: step {step} / n_tokens {n_tokens} must be >= 0")
        if self._cur is not None:
            self.end_step(None, None)
        s = self.settings
        wants = step < s["heatmap_first"] or step % s["heatmap_every"] == 0
        self._cur = _Step(step, kind, n_tokens, wants)

    def node(self, node_id: int, out: torch.Tensor, seconds: float, kernel: str | None = None) -> None:
        """Record one executed node: its output's stats (and heatmap at heatmap steps)."""
        cur = self._cur
        if cur is None:
            raise MinferError("trace: node() called outside begin_step()/end_step()")
        if node_id not in self.kernel_of:
            raise MinferError(f"trace: node id {node_id} is not in the graph given to set_graph()")
        if not isinstance(out, torch.Tensor):
            raise MinferError(f"trace: node {node_id} output is a {type(out).__name__}, expected a tensor")
        arr = host_array(out)
        st = tensor_stats(arr)
        c = cur.cols
        c["id"].append(node_id)
        c["seconds"].append(round(max(float(seconds), 0.0), 9))  # ns: the clocks resolve no finer
        c["shape"].append(list(out.shape))
        c["numel"].append(st.numel)
        c["min"].append(_num(st.min))
        c["max"].append(_num(st.max))
        c["mean"].append(_num(st.mean))
        c["std"].append(_num(st.std))
        c["nan"].append(st.nan)
        c["inf"].append(st.inf)
        if kernel is not None and kernel != self.kernel_of[node_id]:
            cur.kernels[str(node_id)] = kernel
        if cur.heatmap_step:
            self._heatmap(cur, node_id, arr, st.nan + st.inf == 0)

    def step_token(self, seq: int, token_id: int | None, logits: torch.Tensor | None,
                   token_text: str = "") -> None:
        """Record the token sequence `seq` chose in the open step, and (given the logits row it was
        drawn from) the top-k probabilities and entropy. Once per sequence that sampled."""
        cur = self._cur
        if cur is None:
            raise MinferError("trace: step_token() called without begin_step()")
        token_id = None if token_id is None else int(token_id)
        if token_id is not None and token_id < 0:
            raise MinferError(f"trace: token id {token_id} is negative")
        token_text = str(token_text)
        token = top = entropy = None
        if logits is not None:
            d = distribution(logits, self.settings["top_k"], token_id)
            entropy = _num(d.entropy)
            texts = [self.detokenize(i) for i in d.top_ids] if self.detokenize else None
            top = {"ids": d.top_ids, "probs": [_num(p) for p in d.top_probs],
                   "logits": [_num(v) for v in d.top_logits], "texts": texts}
            if token_id is not None:
                token = {"id": token_id, "text": token_text, "prob": _num(d.token_prob),
                         "logit": _num(d.token_logit), "rank": d.token_rank}
        elif token_id is not None:
            token = {"id": token_id, "text": token_text, "prob": None, "logit": None, "rank": None}
        cur.tokens.append({"seq": int(seq), "token": token, "entropy": entropy, "top": top})

    def end_step(self, token_id: int | None = None, logits: torch.Tensor | None = None, token_text: str = "") -> None:
        """Finish the step. A token or logits given here are recorded as sequence 0's (the
        one-sequence shorthand of step_token)."""
        if self._cur is None:
            raise MinferError("trace: end_step() called without begin_step()")
        if token_id is not None or logits is not None:
            self.step_token(0, token_id, logits, token_text)
        cur = self._cur
        first = cur.tokens[0] if cur.tokens else {"token": None, "entropy": None, "top": None}
        self.steps.append(cur.finish(first["token"], first["entropy"], first["top"]))
        self._cur = None

    def close(self) -> None:
        """Write the trace file (atomically: temp file + rename). Idempotent."""
        if self._closed:
            return
        if self._cur is not None:
            self.end_step(None, None)
        doc = {
            "format": FORMAT, "version": VERSION,
            "created": datetime.now(UTC).isoformat(timespec="seconds"),
            "model": self.model_info, "settings": self.settings,
            "graph": self.graph, "steps": self.steps,
            "heatmap_bytes": self.heatmap_bytes, "heatmaps_dropped": self.heatmaps_dropped,
        }
        try:
            # dumps, not dump: json.dump always takes the pure-Python encoder (~10x slower)
            text = json.dumps(doc, separators=(",", ":"), allow_nan=False, default=str)
        except ValueError as e:  # a NaN/Inf in model_info or in a graph node's extra keys
            raise MinferError(f"trace: cannot encode {self.path} as JSON: {e}") from None
        tmp = self.path.with_name(self.path.name + ".tmp")
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            tmp.write_text(text, encoding="utf-8")
            os.replace(tmp, self.path)
        except OSError as e:
            raise MinferError(f"trace: cannot write {self.path}: {e.strerror or e}") from None
        self._closed = True

    def __enter__(self) -> TraceRecorder:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- internals --------------------------------------------------------------------------------

    def _check_writable(self) -> None:
        """A path the trace cannot be written to is a MinferError when the recorder is made: the
        temp file `close` writes is made and removed here (its folder made as close makes it)."""
        if self.path.is_dir():
            raise MinferError(f"trace: cannot write {self.path}: it is a directory")
        tmp = self.path.with_name(self.path.name + ".tmp")
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with open(tmp, "w", encoding="utf-8"):
                pass
            tmp.unlink()
        except OSError as e:
            raise MinferError(f"trace: cannot write {self.path}: {e.strerror or e}") from None

    def _check_open(self) -> None:
        if self._closed:
            raise MinferError(f"trace: recorder for {self.path} is already closed")

    def _heatmap(self, cur: _Step, node_id: int, arr: np.ndarray, all_finite: bool) -> None:
        if self.heatmap_bytes >= self.settings["heatmap_budget"]:
            self.heatmaps_dropped += 1
            return
        hm = heatmap(arr, self.settings["heatmap_max"], all_finite)
        if hm is None:
            return
        self.heatmap_bytes += hm.nbytes()
        cur.heatmaps[str(node_id)] = {"rows": hm.rows, "cols": hm.cols, "h": hm.h, "w": hm.w,
                                      "lo": hm.lo, "hi": hm.hi, "data": hm.data}
