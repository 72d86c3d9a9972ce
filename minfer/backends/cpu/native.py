"""A decode step in one C call: the cpu backend's graph compiled into a program of steps
(q4_vnni.c `prog_run`) over buffers made once, run by one team of threads in one parallel region.

Why: the per-node path (plan.py over steps.py's closures) returns to Python ~17 times a layer and
starts a parallel region in every C call. A SmolLM2 decode step is ~500 nodes: ~5 ms of dispatch
and thread wake-ups whatever the thread count, where llama.cpp's whole step takes 2 ms on 16 cores
(bench/NOTES.md, 2026-12-04). Here Python fills the embedding rows and the rows' positions, then one
call runs every node; each step of the program is a work-shared loop ending in the team's barrier.

What it runs: the decode graphs whose every node it knows (token embedding and its Scale, RMSNorm (qwen3's
and gemma's per-head q / k norms too), the VNNI matmuls with an optional bias, slices as views, RoPE normal /
neox from the backend's tables, attention over the cache with or without a sliding window and a soft-cap,
Add, SwiGLU, GeGLU: llama, qwen2, qwen3, gemma3); anything else (`unsupported` says what: sinks, MoE, SoftCap
on the logits, the int4 path) keeps the per-node path. The steps call the same C kernels as the per-node
path (the same tiles, rows and heads, in the same order; SwiGLU and GeGLU are C for both paths): a row's
numbers are those and do not depend on the batch or the thread count.

Buffers: one per node value, reused once its last reader has run (the graph's liveness), each of
the program's `rows` rows: a program runs any batch of up to that many decode rows (the row count is
an argument of the call; each row's arithmetic is its own), and is dropped when the cache is
reallocated (its addresses are in the steps).
"""

from __future__ import annotations

import ctypes
import math

import torch

from ...graph.ir import Node, Op
from ...kernels.cpu import vnni as cpu_vnni
from ..base import Batch
from ..rope import rope_key

PS_NORM, PS_QUANT, PS_GEMM, PS_ROPE, PS_KV, PS_ATTN, PS_ADD, PS_GLU, PS_GLU_Q, PS_ROW, PS_SCALE, PS_PICK = range(1, 13)
PICK_COLS = 4096  # the greedy pick's columns a work item (PS_PICK: each part's maximum, then the parts in order)
GLU = {Op.SWIGLU: 0, Op.GEGLU: 1}  # q4_vnni.c glu_mul's kinds
ROW_FUSE = 2048  # rows this wide or less: an Add, the RMSNorm of its sum and that norm's int8 pass in one step
# (a decode row then runs on one thread: cheaper than the two barriers it saves while the row is narrow)
CHUNK = cpu_vnni.ATTN_CHUNK  # keys per attention task (q4_vnni.c CHUNK)


class _Step(ctypes.Structure):
    _fields_ = ([(f, ctypes.c_int) for f in ("op", "n", "k", "ldx", "ldy", "ldz", "a0", "a1", "a2", "a3", "a4", "a5")]
                + [("f0", ctypes.c_float), ("f1", ctypes.c_float)]
                + [(f, ctypes.c_void_p) for f in ("x", "y", "z", "w", "s", "zz", "b", "lut", "aux0", "aux1")]
                + [("qp", ctypes.c_int)] + [(f, ctypes.c_void_p) for f in ("q8", "q8d", "q8s", "q816")]
                + [(f, ctypes.c_int) for f in ("kv_head", "kv_n", "kv_ctx")]
                + [(f, ctypes.c_void_p) for f in ("kv_v", "kv_k", "kv_vc")] + [("kv_ldv", ctypes.c_int)]
                + [(f, ctypes.c_int) for f in ("g_kind", "g_ld")] + [("g_out", ctypes.c_void_p)])


class _View:
    """A node's value: columns off .. off + n of a float32 buffer [B, width]."""

    __slots__ = ("buf", "off", "n")

    def __init__(self, buf: torch.Tensor, off: int, n: int):
        self.buf, self.off, self.n = buf, off, n

    @property
    def ptr(self) -> int:
        return self.buf.data_ptr() + 4 * self.off

    @property
    def ld(self) -> int:
        return self.buf.shape[1]


def unsupported(be, node: Node) -> str | None:
    """Why the program cannot run this node (None: it can)."""
    op, p = node.op, node.params
    if op in (Op.INPUT, Op.SLICE, Op.ADD, Op.SWIGLU, Op.GEGLU, Op.SCALE):
        return None
    if op == Op.GET_ROWS:
        return None if ("w" in node.weights) == (node.inputs[0] == 0) else "a row gather of a computed value"
    if op == Op.RMS_NORM:
        if be.int4_inputs(node) or (p.get("group") or 16) % 16:
            return "an RMSNorm feeding torch's int4 kernels, or of groups not a multiple of 16"
        return None
    if op == Op.MATMUL:
        m = be.matrix(node.weights["w"], node.weights.get("b"))
        runs = m._runs
        if any(kind != "vnni" for kind, _ in runs):
            return "a matmul off the VNNI kernels"
        if any(fn.n % 32 for _, fn in runs[:-1]):
            return "stacked parts not on 32-column boundaries"
        return None
    if op == Op.ROPE:
        return None if p["style"] in ("normal", "neox") else f"RoPE style {p['style']}"
    if op == Op.ATTENTION:
        if "sinks" in node.weights:
            return "attention with sinks"
        if not cpu_vnni.attention_fits(p["n_head"], p["n_head_kv"], p["head_dim"]):
            return "attention sizes outside the C kernel's"
        return None
    return f"op {op.value}"


def program_reason(be) -> str | None:
    """Why the backend's graph has no decode program (None: it has one)."""
    if not be.vnni:
        return "the C kernels are not in use"
    for node in be.graph.nodes:
        why = unsupported(be, node)
        if why is not None:
            return f"{node.name}: {why}"
    return None


def _fold_kv(last: dict, op: int, kw: dict) -> bool:
    """A KV write of keys a RoPE step just turned goes into that step (q4_vnni.c PS_ROPE's kv_* fields: the
    item that turns a key head writes it to the cache, kv_n more items copy the values): one barrier less."""
    if op != PS_KV or last["op"] != PS_ROPE or last.get("kv_n"):
        return False
    hd, at = last["a1"], kw["x"] - last["y"]
    if kw["a1"] != hd or kw["ldx"] != last["ldy"] or at % (4 * hd) or not 0 <= at // (4 * hd) <= last["a0"] - kw["a0"]:
        return False
    last.update(kv_head=at // (4 * hd), kv_n=kw["a0"], kv_ctx=kw["a2"], kv_v=kw["z"], kv_ldv=kw["ldz"], kv_k=kw["w"],
                kv_vc=kw["s"])
    return True


def _fold_glu(last: dict, op: int, kw: dict) -> bool:
    """A GLU of the two halves of the GEMM step just before (gate+up, one step over both) goes into that step
    (PS_GEMM's g_* fields: the item of each output group runs its gate tile and its up tile, then their GLU):
    one step and barrier less; its int8 pass follows it in (`_fold_quant`)."""
    if op != PS_GLU or last["op"] != PS_GEMM or last.get("g_out") or kw["x"] != last["y"]:
        return False
    half = last["n"] // 2
    if half % 32 or kw["n"] != half or kw["z"] != last["y"] + 4 * half or not kw["ldx"] == kw["ldz"] == last["ldy"]:
        return False
    last.update(g_kind=kw["a3"], g_out=kw["y"], g_ld=kw["ldy"])
    return True


def _fold_quant(last: dict, op: int, kw: dict) -> bool:
    """The int8 pass of the step just before's output goes into that step (the q8 fields) where its items
    finish whole groups of 32: an attention step (each head's groups once the head is done; head_dim a
    multiple of 32) or a GEMM with its GLU folded in (each item's group). One step and barrier less."""
    if op != PS_QUANT or last.get("q8"):
        return False
    if last["op"] == PS_ATTN:
        out, ld, width, whole = last["y"], last["ldy"], last["a1"] * last["a2"], last["a1"] % 32 == 0
    elif last["op"] == PS_GEMM and last.get("g_out"):
        out, ld, width, whole = last["g_out"], last["g_ld"], last["n"] // 2, True
    else:
        return False
    if not whole or kw["x"] != out or kw["k"] != width or kw["ldx"] != ld:
        return False
    last.update(q8=kw["y"], q8d=kw["aux0"], q8s=kw["aux1"], q816=kw["z"], qp=kw["a0"])
    return True


class DecodeProgram:
    """The graph's decode step for up to `rows` rows as one `prog_run` call (the module docstring)."""

    def __init__(self, be, rows: int):
        self.be, self.rows = be, rows
        g = be.graph
        self.n_vocab = g.meta["n_vocab"]
        self._steps: list[dict] = []
        self._keep: list[torch.Tensor] = []  # every buffer and table an address of the steps points into
        self._free: dict[int, list[torch.Tensor]] = {}  # width -> released buffers
        self.grp = 1
        cache = be.cache
        self.n_slots, self.n_ctx = cache.n_slots, cache.n_ctx
        self.lens = torch.ones(rows, dtype=torch.int32)
        vals: dict[int, _View] = {}
        root: dict[int, int] = {}  # node id -> the node whose buffer its value is (a slice's: its source's)
        live: dict[int, set] = {}  # buffer-owning node id -> nodes with a value in it still to be read
        last = g.consumers_last_use()
        quant: dict[tuple, tuple] = {}
        self.embed = None
        # one attention scratch for every layer (a step's partial results are read before its barrier): its
        # tasks' size at the cache's whole context, the largest of the graph's attention nodes
        attn = [n.params for n in g.nodes if n.op == Op.ATTENTION]
        self._part = self._tensor(torch.zeros(max(
            [rows * p["n_head_kv"] * math.ceil(self.n_ctx / CHUNK) * (p["n_head"] // p["n_head_kv"])
             * (p["head_dim"] + 2) for p in attn] or [1])))
        for node in g.nodes:
            out = self._compile(node, [vals.get(i) for i in node.inputs], quant)
            if out is None:
                continue
            vals[node.id] = out
            src = next((root[i] for i in node.inputs if i in vals and vals[i].buf is out.buf), None)
            root[node.id] = node.id if src is None else src
            live.setdefault(root[node.id], set()).add(node.id)
            for i in set(node.inputs):  # values whose last reader this node was
                if last.get(i) == node.id and i in root and i != g.output:
                    r = root[i]
                    live[r].discard(i)
                    if not live[r] and r != root.get(g.output):
                        buf = vals[r].buf
                        self._free.setdefault(buf.shape[1], []).append(buf)
                        quant = {key: v for key, v in quant.items() if key[0] is not buf}
        self.logits = vals[g.output]
        # the greedy pick, a last step that `run` leaves out and `pick` runs: each row's argmax by the team while
        # the logits are in its caches (read cold by the caller, a 152k-token row took 0.1-0.2 ms to copy alone)
        parts = max(1, math.ceil(self.n_vocab / PICK_COLS))
        self.picked = self._tensor(torch.zeros(rows, dtype=torch.int32))
        pv, pi = self._tensor(torch.zeros(rows * parts)), self._tensor(torch.zeros(rows * parts, dtype=torch.int32))
        self._steps.append(dict(op=PS_PICK, n=self.n_vocab, ldx=self.logits.ld, a0=parts, x=self.logits.ptr,
                                y=self.picked.data_ptr(), z=pv.data_ptr(), w=pi.data_ptr()))
        arr = (_Step * len(self._steps))(*(_Step(**st) for st in self._steps))
        self._array = arr
        self._run = cpu_vnni._library().prog_run

    # ------------------------------------------------------------------ compile
    def _buffer(self, width: int) -> torch.Tensor:
        free = self._free.get(width)
        if free:
            return free.pop()
        t = torch.zeros(self.rows, width)
        self._keep.append(t)
        return t

    def _tensor(self, t: torch.Tensor) -> torch.Tensor:
        self._keep.append(t)
        return t

    def _step(self, op: int, **kw) -> None:
        """Append a step, or fold it into the one before where that one writes what it reads (the same bits:
        each element, row or group is computed by the same code, only the barrier between them goes)."""
        last = self._steps[-1] if self._steps else None
        if last is not None and any(fold(last, op, kw) for fold in (_fold_kv, _fold_glu, _fold_quant)):
            return
        out = None if last is None else last.get("s") if last["op"] == PS_ROW and last["a1"] & 2 else last.get("y")
        if out is not None and kw.get("x") == out:
            quant = dict(zz=kw.get("y"), aux0=kw.get("aux0"), aux1=kw.get("aux1"), b=kw.get("z"), a0=kw.get("a0"))
            if op == PS_QUANT and last["op"] == PS_GLU and last.get("n") % 32 == 0 and kw["k"] == last.get("n"):
                last.update(op=PS_GLU_Q, **quant)
                return
            narrow = last.get("n", 0) <= ROW_FUSE
            if op == PS_QUANT and narrow and kw["k"] == last.get("n") and (
                    (last["op"] == PS_NORM and not last.get("a2")) or (last["op"] == PS_ROW and not last["a1"] & 4)):
                if last["op"] == PS_NORM:  # (a norm alone: the row step without its add)
                    last.update(op=PS_ROW, a1=2, s=last["y"], a3=last["ldy"], y=None)
                last.update(a1=last["a1"] | 4, **quant)
                return
            if op == PS_NORM and not kw.get("a2") and last["op"] == PS_ADD and narrow and kw["n"] == last.get("n"):
                last.update(op=PS_ROW, a1=3, w=kw["w"], f0=kw["f0"], s=kw["y"], a3=kw["ldy"])
                return
        self._steps.append(dict(op=op, **kw))

    def _compile(self, node: Node, ins: list, quant: dict) -> _View | None:
        be, op, p = self.be, node.op, node.params
        if op == Op.INPUT:
            return None
        if op == Op.GET_ROWS:
            if "w" in node.weights:  # the token embedding: rows written by `run` before each call
                self.table = be.table(node.weights["w"].name)
                self.embed = self._tensor(torch.zeros(self.rows, self.table.width))
                return _View(self.embed, 0, self.table.width)
            return ins[0]  # the rows whose logits are asked: all of them here, selected after the call
        if op == Op.SLICE:
            x = ins[0]
            return _View(x.buf, x.off + p["start"], p["stop"] - p["start"])
        if op == Op.RMS_NORM:
            x = ins[0]
            w = self._tensor(be.vector(node.weights["w"].name))
            y = self._buffer(x.n)
            self._step(PS_NORM, n=x.n, ldx=x.ld, ldy=y.shape[1], f0=p["eps"], a2=p.get("group") or 0, x=x.ptr,
                       w=w.data_ptr(), y=y.data_ptr())
            return _View(y, 0, x.n)
        if op == Op.MATMUL:
            return self._matmul(node, ins[0], quant)
        if op == Op.ROPE:
            x = ins[0]
            cos, sin = (self._tensor(t.float().contiguous()) for t in be._ropes[rope_key(node)])
            width = p["n_heads"] * p["head_dim"]
            y = self._buffer(width)
            self._step(PS_ROPE, ldx=x.ld, ldy=y.shape[1], a0=p["n_heads"], a1=p["head_dim"], a2=p["n_rot"],
                       a3=int(p["style"] == "neox"), x=x.ptr, y=y.data_ptr(), w=cos.data_ptr(), s=sin.data_ptr())
            return _View(y, 0, width)
        if op == Op.ATTENTION:
            q, k, v = ins[:3]
            layer, n_head, n_kv, hd = p["kv_layer"], p["n_head"], p["n_head_kv"], p["head_dim"]
            kc, vc = be.cache.k[layer], be.cache.v[layer]
            self._step(PS_KV, ldx=k.ld, ldz=v.ld, a0=n_kv, a1=hd, a2=self.n_ctx, x=k.ptr, z=v.ptr,
                       w=kc.data_ptr(), s=vc.data_ptr())
            grp = n_head // n_kv
            self.grp = max(self.grp, grp)
            first = self._tensor(torch.zeros(self.rows + 1, dtype=torch.int32))
            starts = self._tensor(torch.zeros(self.rows, dtype=torch.int32))  # a window's first keys (prog_run)
            y = self._buffer(n_head * hd)
            self._step(PS_ATTN, ldx=q.ld, ldy=y.shape[1], a0=n_kv, a1=hd, a2=n_head, a3=self.n_ctx,
                       a4=p.get("window") or 0, f0=p["scale"], f1=p.get("softcap") or 0.0, x=q.ptr, y=y.data_ptr(),
                       w=kc.data_ptr(), s=vc.data_ptr(), b=first.data_ptr(), zz=self._part.data_ptr(),
                       aux0=starts.data_ptr())
            return _View(y, 0, n_head * hd)
        if op in (Op.ADD, Op.SWIGLU, Op.GEGLU):
            a, b = ins
            y = self._buffer(a.n)
            self._step(PS_ADD if op == Op.ADD else PS_GLU, n=a.n, ldx=a.ld, ldz=b.ld, ldy=y.shape[1], a3=GLU.get(op, 0),
                       x=a.ptr, z=b.ptr, y=y.data_ptr())
            return _View(y, 0, a.n)
        if op == Op.SCALE:
            x = ins[0]
            y = self._buffer(x.n)
            self._step(PS_SCALE, n=x.n, ldx=x.ld, ldy=y.shape[1], f0=p["scale"], x=x.ptr, y=y.data_ptr())
            return _View(y, 0, x.n)
        raise AssertionError(f"native decode: {node.name} should have been refused")  # (program_reason)

    def _matmul(self, node: Node, x: _View, quant: dict) -> _View:
        m = self.be.matrix(node.weights["w"], node.weights.get("b"))
        runs, passes = m._runs, m.passes(True)
        width = sum(fn.n_pad for _, fn in runs)
        y = self._buffer(width)
        bias = None
        if m.bias is not None:
            bias = self._tensor(torch.zeros(width))
            bias[:m.n] = m.bias.float()
        off = 0
        for (_, fn), P in zip(runs, passes, strict=True):
            q, d, sx, x16 = self._quantized(x, P, quant)
            w, s, z, zm, n_pad, k = fn._ptrs
            self._step(PS_GEMM, n=n_pad, k=k, ldy=width, a0=fn.cbits, a1=P, f0=zm, x=q, aux0=d, aux1=sx, z=x16,
                       w=w, s=s, zz=z, lut=fn._lut, y=y.data_ptr() + 4 * off,
                       b=None if bias is None else bias.data_ptr() + 4 * off)
            off += n_pad
        return _View(y, 0, m.n)

    def _quantized(self, x: _View, P: int, quant: dict) -> tuple:
        """The int8 scratch of x's rows at P passes (one quantize step per value and pass count)."""
        key = (x.buf, x.off, x.n, P)
        for (b, o, n, pp), got in quant.items():  # (tensors hash by identity: compare them so)
            if b is x.buf and (o, n, pp) == key[1:]:
                return got
        k, g = x.n, x.n // 32
        q = self._tensor(torch.zeros(self.rows * P * k, dtype=torch.int8))
        d = self._tensor(torch.zeros(self.rows * P * g))
        sx = self._tensor(torch.zeros(self.rows * g))
        x16 = self._tensor(torch.zeros(self.rows * P * g * 2, dtype=torch.int32))
        self._step(PS_QUANT, k=k, ldx=x.ld, a0=P, x=x.ptr, y=q.data_ptr(), aux0=d.data_ptr(), aux1=sx.data_ptr(),
                   z=x16.data_ptr())
        got = quant[key] = (q.data_ptr(), d.data_ptr(), sx.data_ptr(), x16.data_ptr())
        return got

    # ------------------------------------------------------------------ run
    def run(self, batch: Batch) -> torch.Tensor:
        """Logits [R, n_vocab] float32 of the batch's out_rows (a decode batch of at most `rows` rows)."""
        b = self._call(batch, len(self._steps) - 1)  # (without the pick)
        return self.logits.buf[:b, :self.n_vocab].index_select(0, batch.out_rows.long())

    def pick(self, batch: Batch) -> list[int]:
        """Each row's greedy token (the argmax of its logits, `argmax_rows`' answer), for a decode batch whose
        out_rows are its rows in order: the logits stay in the program's buffer."""
        b = self._call(batch, len(self._steps))
        return self.picked[:b].tolist()

    def _call(self, batch: Batch, n_steps: int) -> int:
        b = batch.n_tokens
        if not 0 < b <= self.rows:
            raise ValueError(f"decode program of {self.rows} rows: a batch of {b}")
        self.table.into(batch.tokens, self.embed[:b])
        slots, pos = (t if t.dtype == torch.int32 and t.is_contiguous() else t.to(torch.int32).contiguous()
                      for t in (batch.row_slots, batch.positions))  # (Batch.build's are: read in place)
        rc = self._run(self._array, n_steps, b, slots.data_ptr(), pos.data_ptr(), self.lens.data_ptr(),
                       self.n_slots, self.n_ctx, self.grp)  # (lens: filled by prog_run, pos + 1)
        if rc:  # (batch.check ran first: rows outside the cache cannot come here; -2 is a thread's scratch)
            raise MemoryError(f"decode program: prog_run returned {rc}")
        return b
