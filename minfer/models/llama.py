"""The llama family (Llama 2/3, SmolLM2, Mistral-style): pre-norm decoder, GQA, SwiGLU, RoPE.

Per layer:  h = x + W_o · attn(rope(W_q·n), rope(W_k·n), W_v·n)   with n = rmsnorm(x)
            x' = h + W_down · (silu(W_gate·m) * W_up·m)            with m = rmsnorm(h)
then logits = W_out · rmsnorm(x_last), W_out = output.weight or (tied) token_embd.weight.

RoPE style: llama.cpp's converter permutes the Q/K rows of llama checkpoints so that rotating
*adjacent* pairs (llama.cpp rope mode 0, our "normal") equals the original rotate-half; so GGUF
llama files use "normal". Families whose converter keeps rows as they are (qwen2) use "neox".
Frequencies: base `rope.freq_base`, the scaling of `rope.scaling.*` (linear or YaRN:
models/rope_scaling.py), and Llama-3 style per-frequency factors from the optional
`rope_freqs.weight` tensor.

qwen2.py and qwen3.py reuse this file: the same Args with `qkv_bias` and the neox rope style
(qwen2), or `qk_norm` (qwen3: per-head RMSNorm of q and k before RoPE, no biases).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from ..errors import MetadataError, ParallelError, UnsupportedError
from ..gguf.reader import GGUFReader
from ..gguf.shard import BY_ROWS, IN_ROW, TensorSlice
from ..graph.builder import GraphBuilder
from ..graph.ir import ROWS, TOKENS, Graph
from .moe import MoEArgs, build_moe_ffn, check_moe, read_moe
from .rope_scaling import read_rope_scaling


@dataclass(frozen=True)
class LlamaArgs:
    arch: str
    n_layer: int
    n_embd: int
    n_ff: int
    n_head: int
    n_head_kv: int
    head_dim: int
    n_rot: int
    n_vocab: int
    n_ctx_train: int
    rms_eps: float
    rope_base: float
    rope_freq_scale: float
    rope_freqs: bool  # the file has rope_freqs.weight (per-frequency divisors)
    tied_output: bool  # no output.weight: logits use token_embd.weight
    qkv_bias: bool = False
    rope_style: str = "normal"
    rope_attn_factor: float = 1.0  # YaRN's / rope.scaling.attn_factor's magnitude on cos and sin
    rope_yarn: tuple | None = None  # (ext_factor, n_ctx_orig, beta_fast, beta_slow) for YaRN
    qk_norm: bool = False  # per-head RMSNorm of q and k before RoPE (qwen3: attn_q_norm, attn_k_norm)
    moe: MoEArgs | None = None  # the FFN routes tokens to experts (mixtral, qwen3moe: models/moe.py)

    @classmethod
    def from_gguf(cls, r: GGUFReader, moe: dict | None = None, **family) -> LlamaArgs:
        """Fill from `{arch}.*` metadata; shapes of the embedding decide n_vocab. `moe`: the
        family's expert defaults (models/moe.py read_moe's keywords, `n_ff` a function of the
        dense n_ff and the experts used) where its files may route tokens to experts."""
        arch = r.get_str("general.architecture")
        k = f"{arch}."
        n_embd = r.get_int(k + "embedding_length")
        n_head = r.get_int(k + "attention.head_count")
        n_head_kv = r.get_int(k + "attention.head_count_kv", n_head)
        for key, v in (("embedding_length", n_embd), ("attention.head_count", n_head),
                       ("attention.head_count_kv", n_head_kv)):
            if v < 1:
                raise MetadataError(k + key, f"must be >= 1, found {v}")
        if n_head % n_head_kv:
            raise MetadataError(k + "attention.head_count_kv",
                                f"{n_head_kv} does not divide head_count {n_head}")
        head_dim = r.get_int(k + "attention.key_length", n_embd // n_head)
        if r.get_int(k + "attention.value_length", head_dim) != head_dim:
            raise UnsupportedError(f"{arch}: value_length != key_length is not supported")
        embd = r.tensors.get("token_embd.weight")  # absent: registry.check_tensors names it
        n_vocab = embd.shape[-1] if embd is not None else r.get_int(k + "vocab_size", 0)
        n_ctx_train = r.get_int(k + "context_length", 2048)
        scaling = read_rope_scaling(r, k, max(1, min(n_ctx_train, MAX_CONTEXT)), MAX_CONTEXT)
        if scaling.kind == "longrope":
            raise UnsupportedError(f"{arch}: rope scaling longrope is supported for phi3 only")
        n_ff = r.get_int(k + "feed_forward_length")
        if moe is not None:
            expert_ff = moe["n_ff"](n_ff, max(1, r.get_int(k + "expert_used_count", 1)))
            family["moe"] = read_moe(r, arch, **{**moe, "n_ff": expert_ff})
        return cls(
            arch=arch,
            n_layer=r.get_int(k + "block_count"),
            n_embd=n_embd,
            n_ff=n_ff,
            n_head=n_head,
            n_head_kv=n_head_kv,
            head_dim=head_dim,
            n_rot=r.get_int(k + "rope.dimension_count", head_dim),
            n_vocab=n_vocab,
            n_ctx_train=n_ctx_train,
            rms_eps=r.get_float(k + "attention.layer_norm_rms_epsilon", 1e-5),
            rope_base=r.get_float(k + "rope.freq_base", 10000.0),
            rope_freq_scale=scaling.freq_scale,
            rope_attn_factor=scaling.attn_factor,
            rope_yarn=scaling.yarn,
            rope_freqs="rope_freqs.weight" in r.tensors,
            tied_output="output.weight" not in r.tensors,
            **family,
        )


# Mixtral (llama.cpp: arch `llama` with expert tensors): the experts are feed_forward_length wide,
# softmax gating, the chosen weights normalised (llama.cpp's llm_build_llama passes norm_w = true)
MIXTRAL_MOE = {"n_ff": lambda n_ff, n_used: n_ff, "norm": True, "gating": "softmax"}


def from_gguf(r: GGUFReader) -> LlamaArgs:
    """A llama file's Args; one with `llama.expert_count` > 0 is a Mixtral-style mixture of experts."""
    return LlamaArgs.from_gguf(r, moe=MIXTRAL_MOE)


# Bounds on hyperparameters, far past any released model, checked before anything is built or
# allocated: a file cannot ask for a graph of a billion layers or a table of 2^34 positions.
MAX_LAYERS = 1024
MAX_DIM = 1 << 17  # embedding / FFN width
MAX_HEADS = 4096
MAX_HEAD_DIM = 1024
MAX_CONTEXT = 1 << 30  # the training context the file declares (allocations follow the context asked)


def check_args(a: LlamaArgs, r: GGUFReader) -> None:
    """MetadataError for a hyperparameter out of bounds or disagreeing with the tensors the file
    holds, before the graph is built: the layer count against the blk.N tensors, the widths against
    the embedding and the first layer's weights, the RoPE and norm constants finite and sane."""
    k = f"{a.arch}."

    def bound(key: str, v: int, hi: int, lo: int = 1) -> None:
        if not lo <= v <= hi:
            raise MetadataError(k + key, f"must be in {lo}..{hi}, found {v}")

    bound("block_count", a.n_layer, MAX_LAYERS)
    bound("embedding_length", a.n_embd, MAX_DIM)
    embd = r.tensors.get("token_embd.weight")
    if embd is not None and (len(embd.shape) != 2 or embd.shape[0] != a.n_embd):
        raise MetadataError(k + "embedding_length", f"is {a.n_embd}, token_embd.weight has shape {list(embd.shape)}")
    bound("feed_forward_length", a.n_ff, MAX_DIM)
    bound("attention.head_count", a.n_head, MAX_HEADS)
    bound("attention.head_count_kv", a.n_head_kv, a.n_head)
    bound("attention.key_length", a.head_dim, MAX_HEAD_DIM)
    bound("rope.dimension_count", a.n_rot, a.head_dim, lo=2)
    if a.n_rot % 2:
        raise MetadataError(k + "rope.dimension_count", f"must be even, found {a.n_rot}")
    bound("context_length", a.n_ctx_train, MAX_CONTEXT)
    sane = (("rope.freq_base", a.rope_base, a.rope_base > 0),
            ("attention.layer_norm_rms_epsilon", a.rms_eps, 0 <= a.rms_eps < 1),
            ("rope.scaling.factor", a.rope_freq_scale, a.rope_freq_scale > 0))
    for key, v, ok in sane:
        if not (math.isfinite(v) and ok):
            raise MetadataError(k + key, f"is not a sane value: {v}")
    check_blocks(k, a.n_layer, a.n_head, a.head_dim, r)
    if a.moe is not None:
        check_moe(a.moe, a.arch, a.n_embd, r)


def check_blocks(k: str, n_layer: int, n_head: int, head_dim: int, r: GGUFReader) -> None:
    """MetadataError unless the file holds exactly blk.0 .. blk.{n_layer-1} and blk.0's attn_q
    (where there is one) has n_head * head_dim outputs; `k` is the "arch." key prefix."""
    layers = {int(m.group(1)) for m in (_BLOCK.match(n) for n in r.tensors) if m}
    if layers != set(range(n_layer)):
        found = f"blk.0..blk.{max(layers)}" if layers else "no blk.N tensors"
        raise MetadataError(k + "block_count", f"says {n_layer} layers, the file holds {found} "
                            f"({len(layers)} distinct)")
    q = r.tensors.get("blk.0.attn_q.weight")
    if q is not None and (len(q.shape) != 2 or q.shape[-1] != n_head * head_dim):
        raise MetadataError(k + "attention.head_count", f"{n_head} heads of {head_dim} do not match "
                            f"blk.0.attn_q.weight's shape {list(q.shape)}")


_BLOCK = re.compile(r"blk\.(\d{1,9})\.")


@dataclass(frozen=True)
class Partition:
    """Rank `rank`'s part of the model split `world` ways, Megatron style: query heads, KV heads
    (replicated when there are fewer than ranks), FFN columns and vocabulary rows, each [lo, hi)."""

    rank: int
    world: int
    heads: tuple[int, int]
    kv_heads: tuple[int, int]
    ff: tuple[int, int]
    vocab: tuple[int, int]
    vocab_widths: tuple[int, ...]  # vocabulary rows of every rank (the last may hold fewer)


def partition(a: LlamaArgs, rank: int, world: int) -> Partition:
    """The split of `a` for one rank; ParallelError when `world` does not divide the model."""
    if a.moe is not None and world > 1:
        raise ParallelError(f"--tp {world}: a mixture-of-experts model ({a.n_layer} layers of {a.moe.n_expert} "
                            "experts) has no tensor-parallel split yet")
    if not 0 <= rank < world:
        raise ParallelError(f"rank {rank} is outside 0..{world - 1}")
    if a.n_head % world:
        raise ParallelError(f"--tp {world} does not divide the model's {a.n_head} attention heads")
    if a.n_head_kv % world and world % a.n_head_kv:
        raise ParallelError(f"--tp {world} and the model's {a.n_head_kv} KV heads: one must divide the other "
                            "(KV heads are split across ranks, or replicated when there are fewer than ranks)")
    if a.n_ff % world:
        raise ParallelError(f"--tp {world} does not divide the model's FFN width {a.n_ff}")
    hq = a.n_head // world
    if a.n_head_kv % world == 0:
        kv = a.n_head_kv // world
        kv_heads = (rank * kv, (rank + 1) * kv)
    else:  # fewer KV heads than ranks: world / n_head_kv ranks share (replicate) each KV head
        k = rank // (world // a.n_head_kv)
        kv_heads = (k, k + 1)
    per = -(-a.n_vocab // world)
    widths = tuple(max(0, min(a.n_vocab, (r + 1) * per) - r * per) for r in range(world))
    if min(widths) < 1:
        raise ParallelError(f"--tp {world} is more ranks than the vocabulary of {a.n_vocab} can be split over")
    ff = a.n_ff // world
    return Partition(rank, world, (rank * hq, (rank + 1) * hq), kv_heads, (rank * ff, (rank + 1) * ff),
                     (rank * per, rank * per + widths[rank]), widths)


def tensor_slices(a: LlamaArgs, part: Partition) -> dict[str, TensorSlice]:
    """The part of every split tensor this rank holds (gguf/shard.py): q/k/v and gate/up rows
    (column-parallel) and their biases, attn_output and ffn_down inside each row (row-parallel),
    token_embd and output rows (vocab-parallel). Norms and rope_freqs are whole on every rank."""
    hd = a.head_dim
    q = (part.heads[0] * hd, part.heads[1] * hd)
    kv = (part.kv_heads[0] * hd, part.kv_heads[1] * hd)
    out = {"token_embd.weight": TensorSlice(BY_ROWS, *part.vocab)}
    if not a.tied_output:
        out["output.weight"] = TensorSlice(BY_ROWS, *part.vocab)
    for i in range(a.n_layer):
        p = f"blk.{i}."
        for name, rows in (("attn_q", q), ("attn_k", kv), ("attn_v", kv)):
            out[p + name + ".weight"] = TensorSlice(BY_ROWS, *rows)
            if a.qkv_bias:
                out[p + name + ".bias"] = TensorSlice(IN_ROW, *rows)
        out[p + "attn_output.weight"] = TensorSlice(IN_ROW, *q)
        out[p + "ffn_gate.weight"] = TensorSlice(BY_ROWS, *part.ff)
        out[p + "ffn_up.weight"] = TensorSlice(BY_ROWS, *part.ff)
        out[p + "ffn_down.weight"] = TensorSlice(IN_ROW, *part.ff)
    return out


def build_graph(a: LlamaArgs, part: Partition | None = None) -> Graph:
    """The forward pass of a llama-family model. Inputs: tokens [T], positions [T], out_rows [R].

    With a `part` (tensor parallelism) the graph is one rank's: its heads, FFN columns and
    vocabulary rows (weights of those shapes: tensor_slices), an AllReduce after the embedding
    (each rank looks up the tokens in its vocabulary rows, the others' rows are zero), after
    attn_output and after ffn_down, and an AllGather of the logits, so every rank ends the step
    with the same full logits."""
    tp = part is not None and part.world > 1
    n_head, n_head_kv, n_ff, n_vocab = a.n_head, a.n_head_kv, a.n_ff, a.n_vocab
    if tp:
        n_head, n_head_kv = part.heads[1] - part.heads[0], part.kv_heads[1] - part.kv_heads[0]
        n_ff, n_vocab = part.ff[1] - part.ff[0], part.vocab[1] - part.vocab[0]
    meta = {"arch": a.arch, "n_vocab": a.n_vocab, "n_layer": a.n_layer, "n_head_kv": n_head_kv,
            "head_dim": a.head_dim, "n_ctx_train": a.n_ctx_train}
    if tp:
        meta.update(tp_rank=part.rank, tp_world=part.world)
    b = GraphBuilder(meta=meta)
    d, hd, nq, nkv = a.n_embd, a.head_dim, n_head * a.head_dim, n_head_kv * a.head_dim
    tokens = b.input("tokens", (TOKENS,), "I32")
    positions = b.input("positions", (TOKENS,), "I32")
    out_rows = b.input("out_rows", (ROWS,), "I32")
    embd = b.weight("token_embd.weight", (d, n_vocab))
    freqs = b.weight("rope_freqs.weight", (a.n_rot // 2,)) if a.rope_freqs else None
    rope = dict(head_dim=hd, n_rot=a.n_rot, style=a.rope_style, base=a.rope_base,
                freq_scale=a.rope_freq_scale, freq_factors=freqs)
    if a.rope_attn_factor != 1.0:
        rope["attn_factor"] = a.rope_attn_factor
    if a.rope_yarn is not None:
        rope["yarn"] = a.rope_yarn

    def reduced(x: int, name: str, layer: int | None = None) -> int:
        return b.all_reduce(x, name + "_allreduce", layer) if tp else x

    if tp:
        lo, hi = part.vocab
        x = b.embed(embd, b.local_ids(tokens, lo, hi, "token_embd_ids"), "token_embd")
        x = reduced(b.mask_rows(x, tokens, lo, hi, "token_embd_mask"), "token_embd")
    else:
        x = b.embed(embd, tokens, "token_embd")
    for i in range(a.n_layer):
        p = f"blk.{i}."

        def w(name: str, *shape: int, p: str = p):
            return b.weight(p + name, shape)

        def bias(name: str, n: int, p: str = p):
            return b.weight(p + name + ".bias", (n,)) if a.qkv_bias else None

        n = b.rms_norm(x, w("attn_norm.weight", d), a.rms_eps, p + "attn_norm", i)
        q = b.matmul(n, w("attn_q.weight", d, nq), p + "attn_q", i, bias("attn_q", nq))
        k = b.matmul(n, w("attn_k.weight", d, nkv), p + "attn_k", i, bias("attn_k", nkv))
        v = b.matmul(n, w("attn_v.weight", d, nkv), p + "attn_v", i, bias("attn_v", nkv))
        if a.qk_norm:  # qwen3: each head's q and k RMS-normed before RoPE
            q = b.rms_norm(q, w("attn_q_norm.weight", hd), a.rms_eps, p + "attn_q_norm", i, group=hd)
            k = b.rms_norm(k, w("attn_k_norm.weight", hd), a.rms_eps, p + "attn_k_norm", i, group=hd)
        q = b.rope(q, positions, n_heads=n_head, name=p + "rope_q", layer=i, **rope)
        k = b.rope(k, positions, n_heads=n_head_kv, name=p + "rope_k", layer=i, **rope)
        att = b.attention(q, k, v, positions, n_head=n_head, n_head_kv=n_head_kv, head_dim=hd,
                          kv_layer=i, name=p + "attn", layer=i)
        o = reduced(b.matmul(att, w("attn_output.weight", nq, d), p + "attn_output", i), p + "attn_output", i)
        h = b.add(x, o, p + "attn_residual", i)
        m = b.rms_norm(h, w("ffn_norm.weight", d), a.rms_eps, p + "ffn_norm", i)
        if a.moe is not None:  # mixtral, qwen3moe: the chosen experts' FFNs (models/moe.py)
            x = b.add(h, build_moe_ffn(b, m, p, i, a.moe, d), p + "ffn_residual", i)
            continue
        gate = b.matmul(m, w("ffn_gate.weight", d, n_ff), p + "ffn_gate", i)
        up = b.matmul(m, w("ffn_up.weight", d, n_ff), p + "ffn_up", i)
        act = b.swiglu(gate, up, p + "ffn_swiglu", i)
        down = reduced(b.matmul(act, w("ffn_down.weight", n_ff, d), p + "ffn_down", i), p + "ffn_down", i)
        x = b.add(h, down, p + "ffn_residual", i)

    last = b.get_rows(x, out_rows, "select_rows")
    n = b.rms_norm(last, b.weight("output_norm.weight", (d,)), a.rms_eps, "output_norm")
    out_w = embd if a.tied_output else b.weight("output.weight", (d, n_vocab))
    logits = b.matmul(n, out_w, "output")
    if tp:
        logits = b.all_gather(logits, part.vocab_widths, part.rank, "output_allgather")
    return b.build(logits)
