"""The models `minfer synth` writes: presets in the exact shapes of real models, and quant mixes.

A random-weight GGUF (gguf/synth.py) of a preset's shapes runs as fast as the real model: speed
and memory traffic do not depend on weight values. This table is plain data (no numpy), so the
command line lists it without importing the writer.

Quant mixes (norms and biases are always F32):
  f32, f16, q4_0, q8_0   every matrix of that type, token_embd too
  q4_1                   matrices Q4_1, token_embd Q8_0 (as in SmolLM2's Q4_1 file)
  q4_k                   matrices Q4_K, output Q6_K (token_embd Q6_K when tied, as it is the
                         output), like llama.cpp's Q4_K_M for the output. A row length that is
                         not a multiple of 256 falls back as llama.cpp does: Q4_K -> Q5_0,
                         Q6_K -> Q8_0 (Q5_K -> Q5_1, Q3_K and Q2_K -> Q4_0).
  q4_k_m, q5_k_m         llama.cpp's Q4_K_M / Q5_K_M mix: q4_k (Q5_K matrices for q5_k_m) with
                         attn_v and ffn_down Q6_K in the `use_more_bits` layers (the first and
                         last eighth, every third between): fused q+k+v of mixed types.
  q6_k, q5_0, q5_1       every matrix of that type, token_embd too
  q3_k, q2_k             matrices Q3_K / Q2_K, output (and a tied token_embd) Q6_K
  iq4_nl, iq4_xs         matrices IQ4_NL / IQ4_XS, output (and a tied token_embd) Q6_K, as
                         llama.cpp's IQ4 mixes; IQ4_XS rows not a multiple of 256 fall back to IQ4_NL
  mxfp4                  matrices MXFP4 (gpt-oss's expert type), output and token_embd Q8_0; for
                         gpt-oss the real file's mix (ggml-org/gpt-oss-20b-GGUF): experts MXFP4,
                         attention, token_embd and output Q8_0, router, biases, sinks and norms F32
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Preset:
    """The shape of one model family member; `tiny` presets get real quantized weights."""

    name: str
    arch: str  # general.architecture: "llama" | "qwen2"
    n_layers: int
    d_model: int
    d_ff: int
    n_head: int
    n_kv_head: int
    vocab: int
    tied: bool  # output projection shares token_embd (no output.weight)
    rope_base: float
    ctx: int
    eps: float
    qkv_bias: bool
    tiny: bool = False
    key_length: int = 0  # attention.key_length when it differs from d_model / n_head (qwen3, gemma)
    extra: tuple[tuple[str, object], ...] = ()  # more `{arch}.` keys: windows, soft-caps, rope scaling
    n_expert: int = 0  # a mixture of experts: expert_count (0: a dense FFN)
    n_expert_used: int = 0  # expert_used_count
    d_ff_exp: int = 0  # expert_feed_forward_length (qwen3moe); mixtral's experts are d_ff wide

    @property
    def expert_ff(self) -> int:
        """Each expert's FFN width."""
        return self.d_ff_exp or self.d_ff

    @property
    def head_dim(self) -> int:
        return self.key_length or self.d_model // self.n_head

    @property
    def spm(self) -> bool:
        """Whether the family's tokenizer is SentencePiece (gemma, phi3), else byte-level BPE."""
        return self.arch in SPM_ARCHS


SPM_ARCHS = ("gemma2", "gemma3", "phi3")
# Metadata of the new families' presets, from their real files (llama.cpp's converters)
_QWEN3_YARN = (("rope.scaling.type", "yarn"), ("rope.scaling.factor", 4.0),
               ("rope.scaling.original_context_length", 128))
_GEMMA3 = (("attention.sliding_window", 512),)
_GEMMA2 = (("attention.sliding_window", 4096), ("attn_logit_softcapping", 50.0), ("final_logit_softcapping", 30.0))
# gpt-oss-20b (HF config: sliding_window 128, rope_scaling yarn factor 32 over 4096, rope_theta 150000)
_GPT_OSS = (("attention.sliding_window", 128), ("rope.scaling.type", "yarn"), ("rope.scaling.factor", 32.0),
            ("rope.scaling.original_context_length", 4096))
_PHI3_128K = (("rope.scaling.original_context_length", 4096), ("rope.scaling.attn_factor", 1.1902380714238083),
              ("attention.sliding_window", 262144))

PRESETS: dict[str, Preset] = {
    p.name: p
    for p in [
        Preset("smollm2-135m", "llama", 30, 576, 1536, 9, 3, 49152, True, 100000.0, 8192, 1e-5, False),
        Preset("qwen2.5-0.5b", "qwen2", 24, 896, 4864, 14, 2, 151936, True, 1e6, 32768, 1e-6, True),
        Preset("qwen2.5-7b", "qwen2", 28, 3584, 18944, 28, 4, 152064, False, 1e6, 32768, 1e-6, True),
        Preset("llama3-8b", "llama", 32, 4096, 14336, 32, 8, 128256, False, 500000.0, 8192, 1e-5, False),
        # the tensor-parallel acceptance shape (`minfer synth llama3-70b q4_k`: ~40 GB, Q6_K output)
        Preset("llama3-70b", "llama", 80, 8192, 28672, 64, 8, 128256, False, 500000.0, 8192, 1e-5, False),
        # d and ff multiples of 256 so every quant type (K-quants too) applies without fallback;
        # one tied and one untied output so parity tests cover both
        Preset("tiny-llama", "llama", 2, 256, 512, 4, 2, 512, True, 10000.0, 512, 1e-5, False, tiny=True),
        Preset("tiny-qwen2", "qwen2", 2, 256, 512, 4, 2, 512, False, 1e6, 512, 1e-6, True, tiny=True),
        Preset("qwen3-0.6b", "qwen3", 28, 1024, 3072, 16, 8, 151936, True, 1e6, 40960, 1e-6, False, key_length=128),
        Preset("qwen3-8b", "qwen3", 36, 4096, 12288, 32, 8, 151936, False, 1e6, 40960, 1e-6, False, key_length=128),
        Preset("gemma3-270m", "gemma3", 18, 640, 2048, 4, 1, 262144, True, 1e6, 32768, 1e-6, False,
               key_length=256, extra=_GEMMA3),
        Preset("gemma3-1b", "gemma3", 26, 1152, 6912, 4, 1, 262144, True, 1e6, 32768, 1e-6, False,
               key_length=256, extra=_GEMMA3),
        Preset("gemma2-2b", "gemma2", 26, 2304, 9216, 8, 4, 256000, True, 1e4, 8192, 1e-6, False,
               key_length=256, extra=_GEMMA2),
        # Phi-3-mini-128k: LongRoPE factors (rope_factors_long / _short), llama.cpp ignores its window
        Preset("phi3-mini", "phi3", 32, 3072, 8192, 32, 32, 32064, False, 1e4, 131072, 1e-5, False,
               extra=_PHI3_128K),
        # the new families in CI: each exercises its family's special parts at sizes where they bite
        # (head size != d / n_head, YaRN with an original context of 128; gemma3: a window of 8 on
        # layer 0, a global layer 1 with linear rope scaling; gemma2: soft-caps of 0.2 on scores (~0.1 here) and
        # 2 on logits; phi3: LongRoPE's long factors past 128 positions, attn_factor)
        Preset("tiny-qwen3", "qwen3", 2, 256, 512, 4, 2, 512, False, 1e6, 4096, 1e-6, False, tiny=True,
               key_length=128, extra=_QWEN3_YARN),
        Preset("tiny-gemma3", "gemma3", 2, 256, 512, 4, 2, 512, True, 1e6, 4096, 1e-6, False, tiny=True,
               key_length=128, extra=(("attention.sliding_window", 8), ("attention.sliding_window_pattern", 2),
                                      ("rope.scaling.type", "linear"), ("rope.scaling.factor", 2.0))),
        Preset("tiny-gemma2", "gemma2", 2, 256, 512, 4, 2, 512, True, 1e4, 4096, 1e-6, False, tiny=True,
               key_length=64, extra=(("attention.sliding_window", 8), ("attn_logit_softcapping", 0.2),
                                     ("final_logit_softcapping", 2.0))),
        Preset("tiny-phi3", "phi3", 2, 256, 512, 4, 4, 512, False, 1e4, 4096, 1e-5, False, tiny=True,
               extra=(("rope.scaling.original_context_length", 128), ("rope.scaling.attn_factor", 1.25),
                      ("attention.sliding_window", 2047))),
        # mixtures of experts: Qwen3-30B-A3B (128 experts of 768, 8 used; feed_forward_length 6144 is
        # the dense width its config also lists) and Mixtral-8x7B (GGUF arch llama, 8 experts of
        # 14336, 2 used); the tiny ones route over few experts with an odd k (tiny-qwen3moe: 3 of 8)
        Preset("qwen3-30b-a3b", "qwen3moe", 48, 2048, 6144, 32, 4, 151936, False, 1e6, 40960, 1e-6, False,
               key_length=128, n_expert=128, n_expert_used=8, d_ff_exp=768),
        Preset("mixtral-8x7b", "llama", 32, 4096, 14336, 32, 8, 32000, False, 1e6, 32768, 1e-5, False,
               n_expert=8, n_expert_used=2),
        Preset("tiny-qwen3moe", "qwen3moe", 2, 256, 512, 4, 2, 512, False, 1e6, 4096, 1e-6, False, tiny=True,
               key_length=128, n_expert=8, n_expert_used=3, d_ff_exp=128),
        Preset("tiny-mixtral", "llama", 2, 256, 256, 4, 2, 512, False, 1e6, 4096, 1e-5, False, tiny=True,
               n_expert=4, n_expert_used=2),
        # gpt-oss-20b: 24 layers of d 2880, 64 query heads of 64 (q is 4096 wide), 8 KV heads, 32 experts of
        # 2880 with 4 used, sliding window 128 on the even layers, YaRN 32x over 4096, attention sinks,
        # biases on q/k/v/o, router and experts; the tiny one: a window of 8 on layer 0, YaRN over 128
        Preset("gpt-oss-20b", "gpt-oss", 24, 2880, 2880, 64, 8, 201088, False, 150000.0, 131072, 1e-5, True,
               key_length=64, extra=_GPT_OSS, n_expert=32, n_expert_used=4, d_ff_exp=2880),
        Preset("tiny-gpt-oss", "gpt-oss", 2, 256, 256, 8, 2, 512, False, 150000.0, 4096, 1e-5, True, tiny=True,
               key_length=64, extra=(("attention.sliding_window", 8), ("rope.scaling.type", "yarn"),
                                     ("rope.scaling.factor", 4.0), ("rope.scaling.original_context_length", 128)),
               n_expert=8, n_expert_used=3, d_ff_exp=128),
    ]
}

QUANTS = ("q4_0", "q4_1", "q8_0", "q4_k", "q4_k_m", "q5_k_m", "q6_k", "q5_0", "q5_1", "q3_k", "q2_k", "iq4_nl",
          "iq4_xs", "mxfp4", "f16", "f32")
