"""RoPE scaling from GGUF metadata, as llama.cpp derives it (llama-model.cpp load_hparams and
llama-context.cpp's yarn_* settings), shared by every model family.

Keys under `{arch}.rope.`: `scaling.type` (none | linear | yarn | longrope; llama.cpp's default
when absent is linear, which with no factor is no scaling), `scaling.factor` (or the old
`scale_linear`): freq_scale = 1 / factor; `scaling.original_context_length` (YaRN's and
LongRoPE's original context, default the training context); `scaling.attn_factor` (a magnitude
on cos / sin: phi3's LongRoPE writes sqrt(1 + ln(s) / ln(orig))).

YaRN (type yarn): ext_factor 1, beta_fast 32, beta_slow 1 (llama.cpp's defaults for these
architectures), and the attention factor llama.cpp computes: get_mscale(factor) / (1 + 0.1 ln
factor) times `scaling.attn_factor`; ggml's rope multiplies in 1 + 0.1 ln factor again
(cpu_ops.rope_table), so the net magnitude is 1 + 0.1 ln factor for factor > 1.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..errors import MetadataError, UnsupportedError
from ..gguf.reader import GGUFReader

KINDS = ("none", "linear", "yarn", "longrope")
YARN_BETA_FAST, YARN_BETA_SLOW = 32.0, 1.0
MAX_FACTOR = 1024.0  # a context scaling factor far past any released model
MAX_ATTN_FACTOR = 16.0


@dataclass(frozen=True)
class RopeScaling:
    kind: str = "none"
    freq_scale: float = 1.0
    attn_factor: float = 1.0
    n_ctx_orig: int = 0  # YaRN's / LongRoPE's original context (0: none given)
    yarn: tuple[float, int, float, float] | None = None  # (ext_factor, n_ctx_orig, beta_fast, beta_slow)

    def rope_kwargs(self) -> dict:
        """The GraphBuilder.rope arguments beyond base / freq_scale (empty for plain RoPE)."""
        out: dict = {}
        if self.attn_factor != 1.0:
            out["attn_factor"] = self.attn_factor
        if self.yarn is not None:
            out["yarn"] = self.yarn
        return out


def read_rope_scaling(r: GGUFReader, k: str, n_ctx_train: int, max_ctx: int) -> RopeScaling:
    """The scaling of `{k}rope.*` (k = "arch."); MetadataError for values out of range,
    UnsupportedError for a type llama.cpp does not define or a YaRN variant we do not run."""
    kind = r.get_str(k + "rope.scaling.type", "linear")
    if kind not in KINDS:
        raise UnsupportedError(f"rope scaling type {kind!r} is not supported (supported: {', '.join(KINDS)})")
    factor = r.get_float(k + "rope.scaling.factor", 0.0) or r.get_float(k + "rope.scale_linear", 0.0)
    if not (math.isfinite(factor) and 0.0 <= factor <= MAX_FACTOR):
        raise MetadataError(k + "rope.scaling.factor", f"must be in 0..{MAX_FACTOR:g}, found {factor}")
    if factor and factor < 1.0 / MAX_FACTOR:
        raise MetadataError(k + "rope.scaling.factor", f"must be >= {1 / MAX_FACTOR:g}, found {factor}")
    freq_scale = 1.0 if kind == "none" or factor == 0.0 else 1.0 / factor
    attn = r.get_float(k + "rope.scaling.attn_factor", 1.0)
    if not (math.isfinite(attn) and 0.0 < attn <= MAX_ATTN_FACTOR):
        raise MetadataError(k + "rope.scaling.attn_factor", f"must be in (0, {MAX_ATTN_FACTOR:g}], found {attn}")
    orig = r.get_int(k + "rope.scaling.original_context_length", n_ctx_train)
    if not 1 <= orig <= max_ctx:
        raise MetadataError(k + "rope.scaling.original_context_length", f"must be in 1..{max_ctx}, found {orig}")
    if kind != "yarn":
        return RopeScaling(kind, freq_scale, attn, orig)
    if r.get_float(k + "rope.scaling.yarn_log_multiplier", 0.0) != 0.0:
        raise UnsupportedError("rope scaling yarn with yarn_log_multiplier (DeepSeek's) is not supported")
    f = 1.0 / freq_scale
    mscale = 1.0 if f <= 1.0 else 0.1 * math.log(f) + 1.0
    yarn_attn = mscale / (1.0 + 0.1 * math.log(f)) * attn
    return RopeScaling(kind, freq_scale, yarn_attn, orig, (1.0, orig, YARN_BETA_FAST, YARN_BETA_SLOW))
