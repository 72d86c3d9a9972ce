"""Synthetic models (`minfer synth`): random-weight GGUF files in the exact shapes of real models.

Speed and memory traffic do not depend on weight values, so benchmarks and the GPU machine
(where real models cannot travel) use these files. Each file carries what llama.cpp and HF
transformers need to load it: the architecture keys llama.cpp's converters write (mirroring the
SmolLM2 file for llama), its tensor names, and a gpt2 byte-level BPE tokenizer: 256 byte tokens
in GPT-2's byte-to-unicode spelling, generated merges up to the vocab size, the ChatML special
tokens and a ChatML chat template.

Weights. Tiny presets (for parity tests) hold real N(0, 0.02) weights quantized with
minfer.quant.reference.quantize where it encodes the type. Big presets (and types quantize
does not encode) get random block bytes with sane scale fields, so dequantized weights have a
realistic magnitude (std ~0.02) and no NaN/inf: fast, and streamed in chunks.

The presets and quant mixes: presets.py (what `minfer synth --help` shows).
"""

from __future__ import annotations

import functools
import math
import random
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path

import numpy as np

from ..errors import UnsupportedError
from ..progress import bar as progress_bar
from ..quant.types import GGMLType, quant_info
from .presets import PRESETS, QUANTS, SPM_ARCHS, Preset  # noqa: F401 (re-exported)
from .reader import ValueType
from .writer import TensorSpec, Value, array, write_gguf

SIGMA = 0.02  # weight std of the synthetic models
CHUNK_BYTES = 32 << 20  # bytes generated and written at a time
PROGRESS_MIN_BYTES = 256 << 20  # show a progress bar for files at least this big
MAX_VOCAB = 1 << 20  # larger vocabularies are refused (real ones: 32k-262k; 2^20 is built in ~20 s)


_MATRIX_TYPE = {"q4_0": GGMLType.Q4_0, "q4_1": GGMLType.Q4_1, "q8_0": GGMLType.Q8_0, "q4_k": GGMLType.Q4_K,
                "q4_k_m": GGMLType.Q4_K, "q5_k_m": GGMLType.Q5_K, "q6_k": GGMLType.Q6_K, "q5_0": GGMLType.Q5_0,
                "q5_1": GGMLType.Q5_1, "q3_k": GGMLType.Q3_K, "q2_k": GGMLType.Q2_K, "iq4_nl": GGMLType.IQ4_NL,
                "iq4_xs": GGMLType.IQ4_XS, "mxfp4": GGMLType.MXFP4, "f16": GGMLType.F16, "f32": GGMLType.F32}
# llama.cpp's llama_ftype of each mix (general.file_type); q4_k is MOSTLY_Q4_K_M (its output), q3_k
# MOSTLY_Q3_K_S (mostly Q3_K)
_FILE_TYPE = {"f32": 0, "f16": 1, "q4_0": 2, "q4_1": 3, "q8_0": 7, "q5_0": 8, "q5_1": 9, "q2_k": 10, "q3_k": 11,
              "q4_k": 15, "q4_k_m": 15, "q5_k_m": 17, "q6_k": 18, "iq4_nl": 25, "iq4_xs": 30, "mxfp4": 38}
_K_MIXES = ("q4_k", "q4_k_m", "q5_k_m", "q3_k", "q2_k", "iq4_nl", "iq4_xs")  # output (and tied token_embd) Q6_K
_MORE_BITS = ("q4_k_m", "q5_k_m")  # attn_v / ffn_down Q6_K in llama.cpp's use_more_bits layers
# llama.cpp's replacement when a row is not a whole number of 256-element super-blocks
_K_FALLBACK = {GGMLType.Q4_K: GGMLType.Q5_0, GGMLType.Q6_K: GGMLType.Q8_0, GGMLType.Q5_K: GGMLType.Q5_1,
               GGMLType.Q3_K: GGMLType.Q4_0, GGMLType.Q2_K: GGMLType.Q4_0, GGMLType.IQ4_XS: GGMLType.IQ4_NL}

SPECIALS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
# gpt-oss's harmony specials (o200k_harmony: <|startoftext|> is BOS, <|return|> EOS, <|endoftext|> padding)
HARMONY_SPECIALS = ("<|startoftext|>", "<|endoftext|>", "<|return|>", "<|constrain|>", "<|channel|>", "<|start|>",
                    "<|end|>", "<|message|>", "<|call|>")
# The harmony format as llama.cpp's built-in gpt-oss formatter writes it (src/llama-chat.cpp
# LLM_CHAT_TEMPLATE_OPENAI_MOE, which it picks for a template holding <|start|> and <|channel|>):
# <|start|>ROLE<|message|>CONTENT<|end|> per message, an earlier assistant reply on the final
# channel closed by <|end|> as gpt-oss's own template writes it (llama.cpp's formatter closes it with
# <|return|>), and <|start|>assistant to open the reply.
HARMONY_TEMPLATE = (
    "{% for m in messages %}"
    "{% if m['role'] == 'assistant' %}"
    "{{ '<|start|>assistant<|channel|>final<|message|>' + m['content'] + '<|end|>' }}"
    "{% else %}{{ '<|start|>' + m['role'] + '<|message|>' + m['content'] + '<|end|>' }}{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|start|>assistant' }}{% endif %}"
)
CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
TOKEN_NORMAL, TOKEN_CONTROL = 1, 3  # llama.cpp's token types
# frequent English letter pairs, most frequent first: the first merges of every synth vocabulary
COMMON_BIGRAMS = ("th he in er an re on at en nd ti es or te of ed is it al ar st to nt ng se ha as ou io "
                  "le ve co me")


# ------------------------------------------------------------------------------ tensor plan
def use_more_bits(layer: int, n_layers: int) -> bool:
    """llama.cpp's choice of the layers whose attn_v / ffn_down a _M mix stores with more bits:
    the first and last eighth and every third layer between."""
    return layer < n_layers // 8 or layer >= 7 * n_layers // 8 or (layer - n_layers // 8) % 3 == 2


def _matrix_type(quant: str, role: str, ne0: int, tied: bool) -> GGMLType:
    t = _MATRIX_TYPE[quant]
    if role == "output" and quant in _K_MIXES:
        t = GGMLType.Q6_K
    elif role == "token_embd" and quant == "q4_1":
        t = GGMLType.Q8_0
    elif role in ("output", "token_embd") and quant == "mxfp4":
        t = GGMLType.Q8_0
    elif role == "token_embd" and quant in _K_MIXES and tied:
        t = GGMLType.Q6_K
    elif role == "more_bits":
        t = GGMLType.Q6_K
    elif role == "kv_8x":
        t = GGMLType.Q8_0
    elif role == "attn_output_8x":
        t = GGMLType.Q5_K
    if ne0 % quant_info(t).block_elems:
        t = _K_FALLBACK[t]
    return t


def plan_tensors(p: Preset, quant: str) -> list[tuple[str, tuple[int, ...], GGMLType, str]]:
    """(name, shape in ne order, type, role) of every tensor, in llama.cpp's naming and order.

    role: "norm" | "bias" | "matrix" | "token_embd" | "output" | "factors_long" | "factors_short".
    """
    if quant not in _MATRIX_TYPE:
        raise UnsupportedError(f"unknown synth quant {quant!r}; choose one of {', '.join(QUANTS)}")
    d, q_dim, kv_dim = p.d_model, p.n_head * p.head_dim, p.n_kv_head * p.head_dim
    out = [("token_embd.weight", (d, p.vocab), _matrix_type(quant, "token_embd", d, p.tied), "token_embd")]

    def mat(name: str, ne0: int, ne1: int, more_bits: bool = False, experts: int = 0, kind: str = "") -> None:
        kind = kind or ("more_bits" if more_bits and quant in _MORE_BITS else "matrix")
        shape = (ne0, ne1, experts) if experts else (ne0, ne1)
        out.append((name, shape, _matrix_type(quant, kind, ne0, p.tied), "matrix"))

    def norm(name: str, n: int = d) -> None:
        out.append((name, (n,), GGMLType.F32, "norm"))

    if p.arch == "phi3":  # LongRoPE's per-frequency divisors, one pair for every layer
        out.append(("rope_factors_long.weight", (p.head_dim // 2,), GGMLType.F32, "factors_long"))
        out.append(("rope_factors_short.weight", (p.head_dim // 2,), GGMLType.F32, "factors_short"))
    gemma = p.arch in ("gemma2", "gemma3")
    oss = p.arch == "gpt-oss"
    # llama.cpp's K-quant mixes for 8-expert models (Mixtral): attn_k and attn_v Q8_0, attn_output Q5_K
    eight_experts = "kv_8x" if p.n_expert == 8 and quant in _K_MIXES and not oss else ""
    # gpt-oss's MXFP4 file (ggml-org/gpt-oss-20b-GGUF): attention Q8_0, only the experts MXFP4
    attn_kind = "kv_8x" if oss and quant == "mxfp4" else ""

    def bias(name: str, *shape: int) -> None:
        out.append((name, shape, GGMLType.F32, "bias"))
    for i in range(p.n_layers):
        b = f"blk.{i}"
        more = use_more_bits(i, p.n_layers)
        norm(f"{b}.attn_norm.weight")
        if p.arch == "phi3":
            mat(f"{b}.attn_qkv.weight", d, q_dim + 2 * kv_dim)
        for proj, dim in (("q", q_dim), ("k", kv_dim), ("v", kv_dim)) if p.arch != "phi3" else ():
            mat(f"{b}.attn_{proj}.weight", d, dim, more and proj == "v",
                kind=attn_kind or (eight_experts if proj != "q" else ""))
            if p.qkv_bias:
                bias(f"{b}.attn_{proj}.bias", dim)
        if p.arch in ("qwen3", "qwen3moe", "gemma3"):
            norm(f"{b}.attn_q_norm.weight", p.head_dim)
            norm(f"{b}.attn_k_norm.weight", p.head_dim)
        mat(f"{b}.attn_output.weight", q_dim, d, kind=attn_kind or ("attn_output_8x" if eight_experts else ""))
        if oss:  # the output projection's bias, each head's sink logit, and the FFN's norm under gemma's name
            bias(f"{b}.attn_output.bias", d)
            bias(f"{b}.attn_sinks.weight", p.n_head)
        if gemma or oss:
            norm(f"{b}.post_attention_norm.weight")
        if not oss:
            norm(f"{b}.ffn_norm.weight")
        if p.n_expert:  # llama.cpp never quantizes the router
            e, ff = p.n_expert, p.expert_ff
            out.append((f"{b}.ffn_gate_inp.weight", (d, e), GGMLType.F32, "matrix"))
            if oss:
                bias(f"{b}.ffn_gate_inp.bias", e)
            mat(f"{b}.ffn_gate_exps.weight", d, ff, experts=e)
            mat(f"{b}.ffn_down_exps.weight", ff, d, more, experts=e)
            mat(f"{b}.ffn_up_exps.weight", d, ff, experts=e)
            if oss:
                bias(f"{b}.ffn_gate_exps.bias", ff, e)
                bias(f"{b}.ffn_down_exps.bias", d, e)
                bias(f"{b}.ffn_up_exps.bias", ff, e)
        elif p.arch == "phi3":  # gate and up stacked in one matrix
            mat(f"{b}.ffn_up.weight", d, 2 * p.d_ff)
        else:
            mat(f"{b}.ffn_gate.weight", d, p.d_ff)
            mat(f"{b}.ffn_up.weight", d, p.d_ff)
        if not p.n_expert:
            mat(f"{b}.ffn_down.weight", p.d_ff, d, more)
        if gemma:
            norm(f"{b}.post_ffw_norm.weight")
    norm("output_norm.weight")
    if not p.tied:
        out.append(("output.weight", (d, p.vocab), _matrix_type(quant, "output", d, p.tied), "output"))
    return out


# ------------------------------------------------------------------------------ tokenizer
def byte_to_unicode() -> list[str]:
    """GPT-2's printable spelling of each byte (index = byte value).

    Bytes that are printable and not space stand for themselves ('!'..'~', '¡'..'¬', '®'..'ÿ');
    the other 68 take the code points 256, 257, ... in byte order (space -> 'Ġ', newline -> 'Ċ').
    """
    keep = set(range(0x21, 0x7F)) | set(range(0xA1, 0xAD)) | set(range(0xAE, 0x100))
    out, extra = [], 0
    for b in range(256):
        if b in keep:
            out.append(chr(b))
        else:
            out.append(chr(256 + extra))
            extra += 1
    return out


def synth_vocab(vocab_size: int, specials_first: bool,
                specials: tuple[str, ...] = SPECIALS) -> tuple[list[str], list[int], list[str], dict[str, int]]:
    """`_synth_vocab` (cached: a 262k vocabulary costs seconds, and a test synthesizes many files of
    one preset), as fresh lists the caller may change."""
    tokens, types, merges, ids = _synth_vocab(vocab_size, specials_first, specials)
    return list(tokens), list(types), list(merges), dict(ids)


@functools.lru_cache(maxsize=4)
def _synth_vocab(vocab_size: int, specials_first: bool, specials: tuple[str, ...] = SPECIALS
                 ) -> tuple[tuple[str, ...], tuple[int, ...], tuple[str, ...], dict[str, int]]:
    """A byte-level BPE vocabulary of exactly `vocab_size` tokens.

    Returns (tokens, token_types, merges, special ids by text). Specials sit first (SmolLM2's
    layout) or last (Qwen's). The first merges are fixed so ordinary text uses them ('Ġ' + each
    lowercase letter, then frequent English bigrams); the rest join an existing token with one
    more letter, digit or punctuation mark ('Ġ', the space, only starts words). Every merged
    token is thus reachable by the merges before it, as BPE requires. Deterministic in
    `vocab_size` alone.
    """
    n_merges = vocab_size - 256 - len(specials)
    if n_merges < 0:
        raise UnsupportedError(f"vocab {vocab_size} is too small: it needs 256 byte tokens "
                               f"+ {len(specials)} specials")
    b2u = byte_to_unicode()
    chars = [b2u[b] for b in b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789.,'-"]
    space = b2u[ord(" ")]
    known = set(b2u)
    merges: list[str] = []
    merged: list[str] = []

    def add(left: str, right: str) -> None:
        tok = left + right
        if tok not in known and len(tok) <= 16 and len(merges) < n_merges:
            known.add(tok)
            merges.append(f"{left} {right}")
            merged.append(tok)

    for c in "abcdefghijklmnopqrstuvwxyz":
        add(space, c)
    for bigram in COMMON_BIGRAMS.split():
        add(bigram[0], bigram[1])
    pool = [space, *chars, *merged]  # left parts: words so far
    rand = random.Random(vocab_size).random
    while len(merges) < n_merges:
        # mostly extend recent short words (an exponential pick among the first ones), else any
        u = rand()
        i = int(-2000 * math.log(1 - rand())) if u < 0.7 else int(rand() * len(pool))
        left = pool[min(i, len(pool) - 1)]
        before = len(merges)
        add(left, chars[int(rand() * len(chars))])
        if len(merges) > before:
            pool.append(merged[-1])
    body = b2u + merged
    tokens = [*specials, *body] if specials_first else [*body, *specials]
    types = [TOKEN_CONTROL if t in specials else TOKEN_NORMAL for t in tokens]
    special_ids = {s: tokens.index(s) for s in specials}
    return tuple(tokens), tuple(types), tuple(merges), special_ids  # (immutable: the cache's copy)


SPM_SPACE = "\u2581"  # "▁"
TOKEN_BYTE = 6
# SentencePiece specials of each family (ids from 0), and their chat template
_SPM_SPECIALS = {
    "gemma": ("<pad>", "<eos>", "<bos>", "<unk>", "<mask>", "<start_of_turn>", "<end_of_turn>"),
    "phi3": ("<unk>", "<s>", "</s>", "<|endoftext|>", "<|system|>", "<|user|>", "<|assistant|>", "<|end|>"),
}
PHI3_TEMPLATE = (
    "{% for message in messages %}"
    "{% if message['role'] == 'system' %}{{'<|system|>\n' + message['content'] + '<|end|>\n'}}"
    "{% elif message['role'] == 'user' %}{{'<|user|>\n' + message['content'] + '<|end|>\n'}}"
    "{% elif message['role'] == 'assistant' %}{{'<|assistant|>\n' + message['content'] + '<|end|>\n'}}"
    "{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>\n' }}{% else %}{{ eos_token }}{% endif %}"
)


def spm_vocab(vocab_size: int, specials: tuple[str, ...]) -> tuple[list[str], list[float], list[int]]:
    """`_spm_vocab` (cached, as `synth_vocab`), as fresh lists."""
    tokens, scores, types = _spm_vocab(vocab_size, tuple(specials))
    return list(tokens), list(scores), list(types)


@functools.lru_cache(maxsize=4)
def _spm_vocab(vocab_size: int, specials: tuple[str, ...]) -> tuple[tuple, tuple, tuple]:
    """A SentencePiece vocabulary of exactly `vocab_size` tokens: the specials (control), the 256
    byte tokens `<0xNN>` (byte fallback), "▁" and the printable ASCII characters (as many as fit),
    then the merged words of `synth_vocab` with "▁" for its space, scored in merge order (SPM merges the
    pair whose joined piece scores highest, so the earlier merges win, as in BPE). Returns
    (tokens, scores, token_types); deterministic in its arguments."""
    room = vocab_size - len(specials) - 256
    if room < 0:
        raise UnsupportedError(f"vocab {vocab_size} is too small for a SentencePiece vocabulary: it needs "
                               f"{len(specials)} specials + 256 byte tokens")
    singles = ([SPM_SPACE] + [chr(c) for c in range(0x21, 0x7F)])[:room]  # a small vocab keeps the first ones
    n_words = room - len(singles)
    _, _, merges, _ = synth_vocab(n_words + 256 + len(SPECIALS), specials_first=False)
    space = byte_to_unicode()[ord(" ")]
    words = [m.replace(" ", "").replace(space, SPM_SPACE) for m in merges]
    tokens = [*specials, *(f"<0x{b:02X}>" for b in range(256)), *singles, *words]
    scores = [0.0] * (len(specials) + 256) + [-1e6] * len(singles) + [-float(i) for i in range(len(words))]
    types = [TOKEN_CONTROL] * len(specials) + [TOKEN_BYTE] * 256 + [TOKEN_NORMAL] * (len(singles) + len(words))
    return tuple(tokens), tuple(scores), tuple(types)


def spm_tokenizer_metadata(p: Preset) -> dict[str, Value | object]:
    """The tokenizer.* keys of a gemma or phi3 preset: a SentencePiece ("llama") vocabulary with
    the family's specials, ids and template (gemma: no space prefix, BOS added; phi3: llama's
    defaults and its <|user|> / <|assistant|> / <|end|> turns). Gemma files carry no template, as
    the real Gemma 3 270M file; minfer's tokenizer recognises the vocabulary (chat.builtin_template)."""
    family = "phi3" if p.arch == "phi3" else "gemma"
    specials = _SPM_SPECIALS[family]
    tokens, scores, types = spm_vocab(p.vocab, specials)
    ids = {t: i for i, t in enumerate(specials)}
    md: dict[str, Value | object] = {
        "tokenizer.ggml.model": "llama",
        "tokenizer.ggml.pre": "default",
        "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.scores": array(ValueType.FLOAT32, scores),
        "tokenizer.ggml.token_type": array(ValueType.INT32, types),
    }
    if family == "gemma":  # no template, like the Gemma 3 270M file: the tokenizer's built-in gemma one applies
        md.update({"tokenizer.ggml.bos_token_id": ids["<bos>"], "tokenizer.ggml.eos_token_id": ids["<eos>"],
                   "tokenizer.ggml.unknown_token_id": ids["<unk>"], "tokenizer.ggml.padding_token_id": ids["<pad>"],
                   "tokenizer.ggml.add_bos_token": True, "tokenizer.ggml.add_eos_token": False,
                   "tokenizer.ggml.add_space_prefix": False})
    else:
        eot = ids["<|endoftext|>"]
        md.update({"tokenizer.ggml.bos_token_id": ids["<s>"], "tokenizer.ggml.eos_token_id": eot,
                   "tokenizer.ggml.unknown_token_id": ids["<unk>"], "tokenizer.ggml.padding_token_id": eot,
                   "tokenizer.ggml.add_bos_token": False, "tokenizer.ggml.add_eos_token": False,
                   "tokenizer.chat_template": PHI3_TEMPLATE})
    return md


def harmony_tokenizer_metadata(p: Preset) -> dict[str, Value | object]:
    """gpt-oss's tokenizer keys: a gpt2 BPE of p.vocab tokens with the harmony specials last, as
    o200k_harmony has them, the real file's pre-tokenizer ("gpt-4o") and the harmony chat template."""
    tokens, types, merges, ids = synth_vocab(p.vocab, False, HARMONY_SPECIALS)
    return {
        "tokenizer.ggml.model": "gpt2",
        "tokenizer.ggml.pre": "gpt-4o",
        "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.token_type": array(ValueType.INT32, types),
        "tokenizer.ggml.merges": array(ValueType.STRING, merges),
        "tokenizer.ggml.bos_token_id": ids["<|startoftext|>"],
        "tokenizer.ggml.eos_token_id": ids["<|return|>"],
        "tokenizer.ggml.padding_token_id": ids["<|endoftext|>"],
        "tokenizer.ggml.add_bos_token": False,
        "tokenizer.ggml.add_space_prefix": False,
        "tokenizer.chat_template": HARMONY_TEMPLATE,
    }


def tokenizer_metadata(p: Preset) -> dict[str, Value | object]:
    """The tokenizer.* keys: a gpt2 BPE of p.vocab tokens, ChatML specials and template (the
    SentencePiece families: spm_tokenizer_metadata)."""
    if p.spm:
        return spm_tokenizer_metadata(p)
    if p.arch == "gpt-oss":
        return harmony_tokenizer_metadata(p)
    specials_first = p.arch == "llama"
    tokens, types, merges, ids = synth_vocab(p.vocab, specials_first)
    eot, start, end = (ids[s] for s in SPECIALS)
    # llama (SmolLM2): bos <|im_start|>, pad <|im_end|>; qwen2: bos and pad <|endoftext|>
    bos, pad = (start, end) if specials_first else (eot, eot)
    return {
        "tokenizer.ggml.model": "gpt2",
        "tokenizer.ggml.pre": "smollm" if p.arch == "llama" else "qwen2",
        "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.token_type": array(ValueType.INT32, types),
        "tokenizer.ggml.merges": array(ValueType.STRING, merges),
        "tokenizer.ggml.bos_token_id": bos,
        "tokenizer.ggml.eos_token_id": end,
        "tokenizer.ggml.unknown_token_id": eot,
        "tokenizer.ggml.padding_token_id": pad,
        "tokenizer.ggml.add_bos_token": False,
        "tokenizer.ggml.add_space_prefix": False,
        "tokenizer.chat_template": CHATML_TEMPLATE,
    }


def model_metadata(p: Preset, quant: str, seed: int) -> dict[str, Value | object]:
    """Every key of the file: general.*, the architecture's hyperparameters, the tokenizer."""
    a = p.arch
    md: dict[str, Value | object] = {
        "general.architecture": a,
        "general.type": "model",
        "general.name": f"minfer-synth {p.name} {quant} seed {seed}",
        "general.file_type": _FILE_TYPE[quant],
        "general.quantization_version": 2,
        f"{a}.block_count": p.n_layers,
        f"{a}.context_length": p.ctx,
        f"{a}.embedding_length": p.d_model,
        f"{a}.feed_forward_length": p.d_ff,
        f"{a}.attention.head_count": p.n_head,
        f"{a}.attention.head_count_kv": p.n_kv_head,
        f"{a}.rope.freq_base": p.rope_base,
        f"{a}.attention.layer_norm_rms_epsilon": p.eps,
    }
    if a == "llama":
        md[f"{a}.vocab_size"] = p.vocab
    if a in ("llama", "phi3"):
        md[f"{a}.rope.dimension_count"] = p.head_dim
    if p.n_expert:
        md[f"{a}.expert_count"] = p.n_expert
        md[f"{a}.expert_used_count"] = p.n_expert_used
        if p.d_ff_exp:
            md[f"{a}.expert_feed_forward_length"] = p.d_ff_exp
    if p.key_length:
        md[f"{a}.attention.key_length"] = p.key_length
        md[f"{a}.attention.value_length"] = p.key_length
    md.update({f"{a}.{k}": v for k, v in p.extra})
    md.update(tokenizer_metadata(p))
    return md


# ------------------------------------------------------------------------------ weights
# Random-block recipe per type: (byte offset, count, kind, scale). "f16": `count` halves drawn
# as scale * U(0.5, 1.5); "i8": `count` signed bytes in 1..63 (Q6_K sub-block scales); "e8m0":
# `count` E8M0 exponents 2^(e - 128) of scale and twice it (MXFP4's shared exponent). The other
# bytes (quants, packed K scales) stay uniformly random. Scales are set so std(weights) ~ SIGMA:
# std of the quant level is 4.6 for 4-bit, 9.2 for 5-bit, 74 for int8, 18.5 for Q6_K's 6-bit
# level; Q6_K's sub-block scales average 32; Q4_K's 6-bit scales and mins are independent and
# uniform in 0..63, which doubles the spread (measured), hence 63 rather than their mean 31.5.
# The lookup types (rms of their table): IQ4 67.4 (times IQ4_XS's random sub-block scales -32..31:
# 1246 in all), MXFP4 5.85.
_Q4, _Q5, _Q8, _Q6 = 4.6, 9.2, 74.0, 18.5
_IQ4, _IQ4_XS, _MXFP4 = 67.4, 1246.0, 5.85
_RANDOM_FIELDS: dict[GGMLType, tuple[tuple[int, int, str, float], ...]] = {
    GGMLType.Q4_0: ((0, 1, "f16", SIGMA / _Q4),),
    GGMLType.Q4_1: ((0, 1, "f16", SIGMA / _Q4), (2, 1, "f16", -7.5 * SIGMA / _Q4)),
    GGMLType.Q5_0: ((0, 1, "f16", SIGMA / _Q5),),
    GGMLType.Q8_0: ((0, 1, "f16", SIGMA / _Q8),),
    GGMLType.Q4_K: ((0, 1, "f16", SIGMA / (63 * _Q4)), (2, 1, "f16", 7.5 * SIGMA / (63 * _Q4))),
    GGMLType.Q6_K: ((192, 16, "i8", 0.0), (208, 1, "f16", SIGMA / (32 * _Q6))),
    # the rest calibrated by measuring the std of 4096 random blocks with d = 1 (their scale and min
    # fields stay uniformly random): Q5_1 11.4, Q5_K 584, Q2_K 15.1, Q3_K 45.4
    GGMLType.Q5_1: ((0, 1, "f16", SIGMA / 11.4), (2, 1, "f16", -15.5 * SIGMA / 11.4)),
    GGMLType.Q5_K: ((0, 1, "f16", SIGMA / 584), (2, 1, "f16", 15.5 * SIGMA / 584)),
    GGMLType.Q2_K: ((80, 1, "f16", SIGMA / 15.1), (82, 1, "f16", 1.5 * SIGMA / 15.1)),
    GGMLType.Q3_K: ((108, 1, "f16", SIGMA / 45.4),),
    GGMLType.IQ4_NL: ((0, 1, "f16", SIGMA / _IQ4),),
    GGMLType.IQ4_XS: ((0, 1, "f16", SIGMA / _IQ4_XS),),
    GGMLType.MXFP4: ((0, 1, "e8m0", SIGMA / _MXFP4 / 1.5),),
}


@functools.cache
def _normal_pool(qtype: GGMLType) -> np.ndarray:
    """2^16 fixed N(0, SIGMA) samples in F32 or F16, indexed by random u16s for fast float weights."""
    x = np.random.default_rng(0).standard_normal(1 << 16, dtype=np.float32) * np.float32(SIGMA)
    return x.astype(np.float32 if qtype == GGMLType.F32 else np.float16)


def random_blocks(rng: np.random.Generator, qtype: GGMLType, n_blocks: int) -> np.ndarray:
    """`n_blocks` random blocks of `qtype` with sane scales, as uint8 [n_blocks, block_bytes]."""
    info = quant_info(qtype)
    if qtype in (GGMLType.F32, GGMLType.F16):
        idx = rng.bit_generator.random_raw((n_blocks + 3) // 4).view(np.uint16)[:n_blocks]
        return _normal_pool(qtype)[idx].view(np.uint8).reshape(n_blocks, info.block_bytes)
    if qtype not in _RANDOM_FIELDS:
        raise UnsupportedError(f"synth has no random-block recipe for {info.name}")
    nbytes = n_blocks * info.block_bytes
    raw = rng.bit_generator.random_raw((nbytes + 7) // 8).view(np.uint8)[:nbytes]
    blocks = raw.reshape(n_blocks, info.block_bytes)
    for off, count, kind, scale in _RANDOM_FIELDS[qtype]:
        if kind == "f16":
            v = (scale * rng.uniform(0.5, 1.5, size=(n_blocks, count))).astype("<f2")
            blocks[:, off:off + 2 * count] = v.view(np.uint8)
        elif kind == "e8m0":
            e = 128 + math.floor(math.log2(scale)) + rng.integers(0, 2, size=(n_blocks, count))
            blocks[:, off:off + count] = e.astype(np.uint8)
        else:
            scales = rng.integers(1, 64, size=(n_blocks, count), dtype=np.int8)
            blocks[:, off:off + count] = scales.view(np.uint8)
    return blocks


def _real_weights(rng: np.random.Generator, shape: tuple[int, ...], qtype: GGMLType, role: str,
                  gain: float = 1.0) -> np.ndarray:
    """N(0, SIGMA) weights (norms around 1) quantized by the reference codec, or random blocks;
    `gain` multiplies the values (the output norm's, for `logit_scale`)."""
    from ..quant.reference import quantize

    rows = math.prod(shape[1:])
    if role.startswith("factors"):
        return _rope_factors(shape[0], role)
    x = rng.standard_normal((rows, shape[0]), dtype=np.float32) * np.float32(SIGMA)
    if role == "norm":
        x = x * np.float32(5) + np.float32(1)
    if gain != 1.0:
        x = x * np.float32(gain)
    try:
        return quantize(x, qtype).numpy()
    except UnsupportedError:
        info = quant_info(qtype)
        return random_blocks(rng, qtype, rows * shape[0] // info.block_elems)


def _random_chunks(rng: np.random.Generator, shape: tuple[int, ...], qtype: GGMLType,
                   role: str) -> Iterator[np.ndarray]:
    info = quant_info(qtype)
    n_blocks = math.prod(shape) // info.block_elems
    if role.startswith("factors"):
        yield _rope_factors(shape[0], role)
        return
    if role == "norm":  # small: weights around 1, like trained RMSNorm gains
        yield (1 + 0.1 * rng.standard_normal(n_blocks)).astype(np.float32)
        return
    per_chunk = max(1, CHUNK_BYTES // info.block_bytes)
    for start in range(0, n_blocks, per_chunk):
        yield random_blocks(rng, qtype, min(per_chunk, n_blocks - start))


def _rope_factors(n: int, role: str) -> np.ndarray:
    """LongRoPE divisors shaped like Phi-3-128k's: ~1 for the fast frequencies rising to ~3
    (short) or ~40 (long) for the slowest."""
    top = 40.0 if role == "factors_long" else 3.0
    return (1.0 + (top - 1.0) * np.linspace(0.0, 1.0, n) ** 3).astype(np.float32)


def _tensor_data(seed: int, index: int, shape, qtype: GGMLType, role: str,
                 real: bool, gain: float = 1.0) -> Callable[[], object]:
    """Lazy data of one tensor; its own generator, so the bytes depend only on (seed, index)."""

    def make():
        rng = np.random.Generator(np.random.SFC64(np.random.SeedSequence([seed, index])))
        if real:
            return _real_weights(rng, shape, qtype, role, gain)
        return _random_chunks(rng, shape, qtype, role)

    return make


def synth(preset: str, quant: str, out: str | Path, *, seed: int = 0, vocab: int | None = None,
          progress: bool | None = None, header_only: bool = False, logit_scale: float = 1.0) -> Path:
    """Write a random-weight GGUF of `preset`'s shapes in quant mix `quant`; returns its path.

    `vocab` overrides the preset's vocabulary size (smaller files); `progress` shows a progress bar
    on stderr (default: for files of 256 MiB or more). `header_only`: the metadata and tensor
    table, the data a sparse hole of zeros (a 7B file in no disk space and no time: for plans and
    shape checks; its weights are all zero). `logit_scale` (tiny presets): multiplies the output
    norm's weights, so every logit by that factor, and nothing else: a random model's next-token
    distribution is nearly flat (top-1 / top-2 margins ~0.1 on the tiny presets), a scaled one
    decisive, so that greedy comparisons between backends have steps to compare (tests).
    """
    if preset not in PRESETS:
        raise UnsupportedError(f"unknown synth preset {preset!r}; choose one of {', '.join(PRESETS)}")
    p = PRESETS[preset]
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise UnsupportedError(f"seed {seed!r}: a weight seed is an integer >= 0")
    if vocab is not None:
        if int(vocab) > MAX_VOCAB:  # (too small: synth_vocab says what it needs)
            raise UnsupportedError(f"vocab {vocab} is too large: at most {MAX_VOCAB:,} tokens")
        p = replace(p, vocab=int(vocab))
    if logit_scale != 1.0 and not (p.tiny and math.isfinite(logit_scale) and logit_scale > 0):
        raise UnsupportedError(f"logit_scale {logit_scale!r}: a finite positive factor, for tiny presets only "
                               f"({preset} is {'tiny' if p.tiny else 'not tiny'})")
    plan = plan_tensors(p, quant)
    metadata = model_metadata(p, quant, seed)
    if logit_scale != 1.0:
        metadata["general.name"] = f"{metadata['general.name']} logit scale {logit_scale:g}"
    tensors = [TensorSpec(name, shape, qtype, _tensor_data(seed, i, shape, qtype, role, p.tiny,
                                                           logit_scale if name == "output_norm.weight" else 1.0))
               for i, (name, shape, qtype, role) in enumerate(plan)]
    if header_only:
        return write_gguf(out, metadata, tensors, sparse=True)
    total = sum(quant_info(t).nbytes(math.prod(s)) for _, s, t, _ in plan)
    show = total >= PROGRESS_MIN_BYTES if progress is None else progress
    if not show:
        return write_gguf(out, metadata, tensors)
    with progress_bar(total=total, unit="B", unit_scale=True, desc=f"synth {preset} {quant}") as bar:
        return write_gguf(out, metadata, tensors, progress=bar.update)

