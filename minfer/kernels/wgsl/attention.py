"""The WGSL attention (vk_attention: attention.fkc.md): the KV-cache write and causal GQA
attention over the cache, single-pass or split over the context (`ATTN`; the device's `attn`
variant, EngineConfig.vk_attn / MINFER_VK_ATTN, `attn_variant`)."""

from __future__ import annotations

import math

from ...errors import UnsupportedError
from ._common import SHADERS, WG, VkTensor, _at, _check, _host_bridge, _out
from .quantize import quantize_q8_1, records_passes

REVISION_SOURCES = SHADERS
ATTN_WG = 64
# attention: split over the context in chunks of >= CH positions (at most MAX_SPLIT chunks), WG
# invocations per chunk; split False: the single-pass kernel (one workgroup per head and row)
ATTN = {"split": True, "WG": 128, "CH": 64, "MAX_SPLIT": 32}
MAX_HEAD_DIM = 256  # gemma's; past 128 the split kernel only (the single-pass one was wrong there on NVIDIA)
SINGLE_PASS_MAX_HEAD_DIM = 128
MAX_TK = 32  # lanes a key's dot product is summed over: one subgroup of NVIDIA's 32 (two came out wrong)


def attn_variant(text: str) -> dict:
    """ATTN with the fields of "name=value,..." (MINFER_VK_ATTN) replaced."""
    out = dict(ATTN)
    for item in filter(None, (t.strip() for t in text.split(","))):
        key, _, val = item.partition("=")
        if key not in ATTN:
            raise UnsupportedError(f"vk attention variant: unknown field {key!r} (fields: {', '.join(ATTN)})")
        try:
            out[key] = bool(int(val)) if key == "split" else int(val)
        except ValueError:
            raise UnsupportedError(f"vk attention variant: {key}={val!r} is not an integer") from None
    return out


def _sinks(shader: str, consts: dict, sinks, at: int) -> tuple[str, dict]:
    """(shader, consts) of a kernel's variant with or without attention sinks (SINKS; attn_sinks.wgsl
    binds them at `at`, the shader's next free binding)."""
    if sinks is None:
        return "attn_no_sinks+" + shader, {**consts, "SINKS": 0}
    return "attn_sinks+" + shader, {**consts, "SINKS": 1, "SINK_AT": at}


def _bound(sinks) -> list:
    return [] if sinks is None else [sinks]


@_host_bridge(mutates=("cache_k", "cache_v"))
def attention(q: VkTensor, k: VkTensor, v: VkTensor, cache_k: VkTensor, cache_v: VkTensor, row_slots: VkTensor,
              positions: VkTensor, layer: int, n_head: int, n_head_kv: int, head_dim: int, scale: float,
              spans=None, tiles=None, out: VkTensor | None = None, q8: VkTensor | None = None, window: int = 0,
              softcap: float = 0.0, sinks: VkTensor | None = None) -> VkTensor:
    """Write each row's k, v at (its slot, its position) of layer `layer` of the f32 cache
    [layers, slots, n_kv, ctx, head_dim], then each row's causal GQA attention over positions
    0..its position of its slot. Two dispatches: every row's keys are written before any is read.
    q8: a q8_records buffer filled with out's int8 records (as rms_norm's), by the split kernel's
    merge where it runs (head_dim a multiple of 32), else by a dispatch of their own. `spans`,
    `tiles`: the host's spans / a prompt's tile table (other backends' kernels; read on the device here).
    `window` > 0: each row attends its last `window` positions only (the cache keeps every
    position); `softcap` > 0: scores s become softcap * tanh(s / softcap) before the softmax.
    `sinks` f32 [n_head]: each head's learned logit joins the softmax's max and denominator, adding
    no value (gpt-oss): in the single-pass kernel's end, or the split merge."""
    what = "vk attention"
    if isinstance(window, bool) or not isinstance(window, int) or window < 0:
        raise UnsupportedError(f"{what}: window must be an int >= 0 (0: none), got {window!r}")
    if isinstance(softcap, bool) or not isinstance(softcap, float | int) or not 0 <= softcap < float("inf"):
        raise UnsupportedError(f"{what}: softcap must be a finite number >= 0 (0: none), got {softcap!r}")
    for name, t in (("q", q), ("k", k), ("v", v)):
        _check(what, name, t, "F32", (2,))
    for name, t in (("cache_k", cache_k), ("cache_v", cache_v)):
        _check(what, name, t, "F32", (5,), contiguous=True)
    for name, t in (("row_slots", row_slots), ("positions", positions)):
        _check(what, name, t, "I32", (1,), contiguous=True)
    layers, slots, nkv, ctx, hd = cache_k.shape
    rows = q.shape[0]
    if (nkv, hd) != (n_head_kv, head_dim) or cache_v.shape != cache_k.shape or not 0 <= layer < layers:
        raise UnsupportedError(f"{what}: caches {cache_k.shape} / {cache_v.shape} do not hold layer {layer} of "
                               f"{n_head_kv} x {head_dim}")
    if q.shape[1] != n_head * hd or k.shape != (rows, nkv * hd) or v.shape != (rows, nkv * hd):
        raise UnsupportedError(f"{what}: q {q.shape}, k {k.shape}, v {v.shape} are not [{rows}, heads x {hd}]")
    if hd > MAX_HEAD_DIM:
        raise UnsupportedError(f"{what}: head_dim {hd} > {MAX_HEAD_DIM} is not supported")
    if n_head % n_head_kv or hd > 4 * ATTN_WG or row_slots.numel != rows or positions.numel != rows:
        raise UnsupportedError(f"{what}: {n_head} heads over {n_head_kv} kv heads, head_dim {hd} <= {4 * ATTN_WG}, "
                               "one slot and one position per row")
    if sinks is not None:
        _check(what, "sinks", sinks, "F32", (1,), contiguous=True)
        if sinks.numel != n_head:
            raise UnsupportedError(f"{what}: sinks must be f32 [{n_head}] (one logit per query head), got "
                                   f"{sinks.shape}")
    base = cache_k.offset + layer * slots * nkv * ctx * hd
    if cache_v.offset != cache_k.offset:
        raise UnsupportedError(f"{what}: cache_k and cache_v must start at the same element")
    dev = q.dev
    dev.dispatch(dev.pipeline("kv_store", {"WG": WG}), [k, v, row_slots, positions, cache_k, cache_v],
                 [nkv, hd, ctx, base, k.offset, k.stride, v.offset, v.stride], (-(-(nkv * hd) // WG), rows))
    out = _out(what, out, q, (rows, n_head * hd))
    passes = records_passes(what, q8, rows, n_head * hd) if q8 is not None else 0
    cfg = dev.attn or ATTN
    if not cfg["split"] or hd % 4 or base % 4:  # one workgroup per (head, row) over every position
        if hd > SINGLE_PASS_MAX_HEAD_DIM:
            raise UnsupportedError(f"{what}: head_dim {hd} > {SINGLE_PASS_MAX_HEAD_DIM} runs the split kernel only "
                                   "(the single-pass one gave wrong results there on NVIDIA's driver, bench/NOTES.md "
                                   "run 37): it needs head_dim % 4 == 0 and the split variant")
        dev.dispatch(dev.pipeline(*_sinks("attention", {"WG": ATTN_WG}, sinks, 7)),
                     [q, cache_k, cache_v, row_slots, positions, _at(out), *_bound(sinks)],
                     [n_head, nkv, hd, ctx, base, q.offset, q.stride, float(scale), window, float(softcap)],
                     (n_head, rows))
        if passes:
            quantize_q8_1(x=out, passes=passes, out=q8)
        return out
    # split over the context: chunks of `ch` positions (a function of ctx alone: batch invariance),
    # each (head, row, chunk) a workgroup, then one merge per (head, row)
    tk = min(MAX_TK, 1 << max(0, math.ceil(math.log2(-(-hd // 4)))))
    nv = -(-hd // (4 * tk))  # quads of head dims per lane
    wg = max(cfg["WG"], tk)
    ch = max(cfg["CH"], -(-ctx // cfg["MAX_SPLIT"]))
    n_split = -(-ctx // ch)
    part = dev.empty((rows, n_head, n_split, hd + 2))
    dev.dispatch(dev.pipeline("attention_split", {"WG": wg, "TK": tk, "NV": nv}),
                 [q, cache_k, cache_v, row_slots, positions, part],
                 [n_head, nkv, hd, ctx, base, q.offset, q.stride, float(scale), ch, n_split, window, float(softcap)],
                 (n_head, rows, n_split))
    if passes and hd % 32 == 0:
        dev.dispatch(dev.pipeline(*_sinks("q8_act+merge_splits+attention_merge_q8", {"WG": ATTN_WG, "P8": passes},
                                          sinks, 5)),
                     [part, positions, _at(out), q8, *_bound(sinks)], [n_head, hd, ch, n_split], (n_head, rows))
        return out
    dev.dispatch(dev.pipeline(*_sinks("merge_splits+attention_merge", {"WG": ATTN_WG}, sinks, 4)),
                 [part, positions, _at(out), *_bound(sinks)], [n_head, hd, ch, n_split], (n_head, rows))
    if passes:
        quantize_q8_1(x=out, passes=passes, out=q8)
    return out
