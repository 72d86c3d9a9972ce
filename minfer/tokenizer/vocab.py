"""The tokenizer section of GGUF metadata -> a validated `Vocab`.

Mirrors what llama.cpp's `llama_vocab::impl::load` derives from the same keys: token attributes
from `tokenizer.ggml.token_type`, default special ids per model type, the special ids given by
the file (ignored with a warning when out of range), the text-based auto-detection of EOT/FIM
tokens, and the end-of-generation (EOG) set. Missing or ill-typed keys raise TokenizerError
naming the key; an unknown `tokenizer.ggml.model` raises UnsupportedError.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from itertools import repeat
from typing import Any

from ..errors import TokenizerError, UnsupportedError
from .pretokenize import VARIANTS, PreTokenizer

# token attributes (llama.h llama_token_attr)
ATTR_UNDEFINED = 0
ATTR_UNKNOWN = 1 << 0
ATTR_UNUSED = 1 << 1
ATTR_NORMAL = 1 << 2
ATTR_CONTROL = 1 << 3
ATTR_USER_DEFINED = 1 << 4
ATTR_BYTE = 1 << 5

# tokenizer.ggml.token_type value -> attribute (1 normal, 2 unknown, 3 control, 4 user-defined, 5 unused, 6 byte)
_TYPE_ATTR = {1: ATTR_NORMAL, 2: ATTR_UNKNOWN, 3: ATTR_CONTROL, 4: ATTR_USER_DEFINED, 5: ATTR_UNUSED, 6: ATTR_BYTE}

SUPPORTED_MODELS = ("gpt2", "llama")

K = "tokenizer.ggml."
# (special-id name, key); the deprecated prefix/suffix/middle keys come last and win, as in llama.cpp
_SPECIAL_KEYS = (
    ("bos", K + "bos_token_id"), ("eos", K + "eos_token_id"), ("eot", K + "eot_token_id"),
    ("eom", K + "eom_token_id"), ("unk", K + "unknown_token_id"), ("sep", K + "seperator_token_id"),
    ("pad", K + "padding_token_id"), ("mask", K + "mask_token_id"),
    ("fim_pre", K + "fim_pre_token_id"), ("fim_suf", K + "fim_suf_token_id"),
    ("fim_mid", K + "fim_mid_token_id"), ("fim_pad", K + "fim_pad_token_id"),
    ("fim_rep", K + "fim_rep_token_id"), ("fim_sep", K + "fim_sep_token_id"),
    ("fim_pre", K + "prefix_token_id"), ("fim_suf", K + "suffix_token_id"), ("fim_mid", K + "middle_token_id"),
)

# texts llama.cpp recognises when the file does not name these tokens
_AUTODETECT = {
    "eot": ("<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>", "<|end_of_text|>",
            "<EOT>", "_<EOT>", "[EOT]", "<｜end▁of▁sentence｜>", "<end_of_utterance>"),
    "eom": ("<|eom_id|>",),
    "fim_pre": ("<|fim_prefix|>", "<fim-prefix>", "<fim_prefix>", "<｜fim▁begin｜>", "<PRE>", "▁<PRE>",
                "<|code_prefix|>", "<|prefix|>"),
    "fim_suf": ("<|fim_suffix|>", "<fim-suffix>", "<fim_suffix>", "<｜fim▁hole｜>", "<SUF>", "▁<SUF>",
                "<|code_suffix|>", "<|suffix|>"),
    "fim_mid": ("<|fim_middle|>", "<fim-middle>", "<fim_middle>", "<｜fim▁end｜>", "<MID>", "▁<MID>",
                "<|code_middle|>", "<|middle|>"),
    "fim_pad": ("<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]"),
    "fim_rep": ("<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>"),
    "fim_sep": ("<|file_sep|>",),
}
_EOG_TEXTS = frozenset((
    "<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<|flush|>", "<|calls|>",
    "<end_of_turn>", "<|endoftext|>", "</s>", "<|eom_id|>", "<EOT>", "_<EOT>", "[EOT]", "[EOS]",
    "<|end_of_text|>", "<end_of_utterance>", "<eos>", "<turn|>", "<|tool_response>",
    "<｜end▁of▁sentence｜>", "[e~[",
))
_ALWAYS_RENDERED = frozenset(("<|channel|>", "<|message|>", "<|start|>", "<|constrain|>"))


@dataclass(frozen=True)
class Vocab:
    """Everything the tokenizer needs, validated. Token texts are as stored in the file."""

    model: str  # "gpt2" (byte-level BPE) or "llama" (SentencePiece)
    pre: PreTokenizer | None  # gpt2 only
    texts: list[str]
    scores: list[float]
    attrs: list[int]
    token_to_id: dict[str, int]
    ranks: dict[tuple[str, str], int]  # gpt2 merges: (left, right) -> rank
    special: dict[str, int | None]  # bos, eos, eot, eom, unk, sep, pad, mask, fim_*
    eog_ids: frozenset[int]
    special_order: tuple[int, ...]  # control/user-defined/unknown ids, longest text first
    add_bos: bool
    add_eos: bool
    add_space_prefix: bool
    clean_spaces: bool
    chat_template: str | None
    rstrip_ids: frozenset[int] = frozenset()  # special tokens that eat the whitespace after them


_MISSING = object()


def _value(meta: Mapping[str, Any], key: str, kind: type, default: Any = _MISSING) -> Any:
    if key not in meta:
        if default is _MISSING:
            raise TokenizerError(f"{key}: missing from the model metadata")
        return default
    v = meta[key]
    ok = isinstance(v, kind) and not (kind is int and isinstance(v, bool))
    if not ok:
        raise TokenizerError(f"{key}: expected {kind.__name__}, found {type(v).__name__}")
    return v


def _array(meta: Mapping[str, Any], key: str, elem: tuple[type, ...], n_min: int, required: bool) -> list | None:
    if key not in meta:
        if required:
            raise TokenizerError(f"{key}: missing from the model metadata")
        return None
    v = meta[key]
    names = "/".join(t.__name__ for t in elem)
    if not isinstance(v, (list, tuple)):
        raise TokenizerError(f"{key}: expected an array of {names}, found {type(v).__name__}")
    bad = set(map(type, v)) - set(elem)
    if bad:
        found = ", ".join(sorted(t.__name__ for t in bad))
        raise TokenizerError(f"{key}: expected an array of {names}, found elements of type {found}")
    if len(v) < n_min:
        raise TokenizerError(f"{key}: has {len(v)} entries but the vocabulary has {n_min} tokens")
    return list(v)


def _pre_tokenizer(meta: Mapping[str, Any]) -> PreTokenizer:
    name = _value(meta, K + "pre", str, "")
    if name in VARIANTS:
        return VARIANTS[name]
    what = "missing" if not name else f"unknown pre-tokenizer {name!r}"
    warnings.warn(
        f"{K}pre: {what}; falling back to 'default' (tokenization may differ from the model's). "
        f"Supported: {', '.join(sorted(VARIANTS))}",
        stacklevel=3,
    )
    return VARIANTS["default"]


def _split_merge(m: str) -> tuple[str, ...]:
    """"left right" -> (left, right), splitting at the first space after the first character."""
    if m[:1] != " ":
        return tuple(m.split(" ", 1))
    sep = m.find(" ", 1)
    return (m[:sep], m[sep + 1:]) if sep > 0 else ()


def _merge_ranks(merges: list[str]) -> dict[tuple[str, str], int]:
    """(left, right) -> rank; a pair listed twice keeps its first rank. Malformed entries (no
    space) become keys that never match, as in llama.cpp."""
    if " " in {m[:1] for m in merges}:  # rare: a left symbol that is itself a space
        pairs = [_split_merge(m) for m in merges]
    else:
        pairs = list(map(tuple, map(str.split, merges, repeat(" "), repeat(1))))
    return dict(zip(reversed(pairs), range(len(pairs) - 1, -1, -1), strict=True))


def load_vocab(meta: Mapping[str, Any]) -> Vocab:
    """Build and validate the vocabulary from GGUF metadata (key -> python value)."""
    if not isinstance(meta, Mapping):
        raise TokenizerError(f"tokenizer metadata must be a mapping of GGUF keys, got {type(meta).__name__}")
    model = _value(meta, K + "model", str)
    if model not in SUPPORTED_MODELS:
        raise UnsupportedError(f"{K}model {model!r} is not supported; supported: {', '.join(SUPPORTED_MODELS)}")

    tokens = _array(meta, K + "tokens", (str,), 0, required=True)
    n = len(tokens)
    if n == 0:
        raise TokenizerError(f"{K}tokens: the vocabulary is empty")
    types = _array(meta, K + "token_type", (int,), n, required=False)
    raw_scores = _array(meta, K + "scores", (int, float), n, required=False)
    scores = [float(s) for s in raw_scores[:n]] if raw_scores is not None else [0.0] * n

    if model == "llama":
        pre = None
        ranks: dict[tuple[str, str], int] = {}
        special: dict[str, int | None] = {"bos": 1, "eos": 2, "unk": 0}
        add_space_prefix, add_bos, clean_spaces = True, True, False
    else:
        pre = _pre_tokenizer(meta)
        ranks = _merge_ranks(_array(meta, K + "merges", (str,), 0, required=True))
        special = {"bos": 11, "eos": 11}
        add_space_prefix, add_bos, clean_spaces = False, pre.add_bos, pre.clean_spaces
    add_space_prefix = _value(meta, K + "add_space_prefix", bool, add_space_prefix)

    texts = [t or f"[EMPTY_{i}]" for i, t in enumerate(tokens)] if "" in tokens else tokens
    token_to_id = dict(zip(texts, range(n), strict=True))  # (a duplicate keeps its last id: caught below)
    if len(token_to_id) != n:
        first: dict[str, int] = {}
        dup = next(i for i, t in enumerate(texts) if first.setdefault(t, i) != i)
        raise TokenizerError(f"{K}tokens: duplicate token {texts[dup]!r} at ids {first[texts[dup]]} and {dup}")
    if types is not None:
        attrs = list(map(_TYPE_ATTR.get, types[:n], repeat(ATTR_UNDEFINED)))
    else:
        attrs = [ATTR_NORMAL] * n

    for name, key in _SPECIAL_KEYS:
        default = special.get(name)
        if default is not None and default >= n:
            special[name] = None
        if key not in meta:
            continue
        tid = _value(meta, key, int)
        if 0 <= tid < n:
            special[name] = tid
        else:
            warnings.warn(f"{key}: id {tid} is outside the vocabulary (size {n}); ignored", stacklevel=2)
    special = {name: special.get(name) for name, _ in _SPECIAL_KEYS}

    add_bos = _value(meta, K + "add_bos_token", bool, add_bos)
    add_eos = _value(meta, K + "add_eos_token", bool, False)
    for flag, name in ((add_bos, "bos"), (add_eos, "eos")):
        if flag and special[name] is None:
            raise TokenizerError(f"{K}add_{name}_token is true, but {K}{name}_token_id is not set")

    eog = _detect_special_tokens(texts, token_to_id, attrs, special)
    special_order = tuple(sorted(
        (i for i, a in enumerate(attrs) if a & (ATTR_CONTROL | ATTR_USER_DEFINED | ATTR_UNKNOWN)),
        key=lambda i: -len(texts[i].encode("utf-8", "surrogateescape")),
    ))
    template = _value(meta, "tokenizer.chat_template", str, None)
    return Vocab(model, pre, texts, scores, attrs, token_to_id, ranks, special, eog, special_order,
                 add_bos, add_eos, add_space_prefix, clean_spaces, template,
                 _rstrip_ids(meta, token_to_id, special_order))


def _rstrip_ids(meta: Mapping[str, Any], token_to_id: dict[str, int], special_order: tuple[int, ...]) -> frozenset[int]:
    """llama.cpp's per-model token attributes (llama_vocab::impl::load): for a model whose
    `general.name` contains "phi-3" or "phi3" (any case), every special token and "</s>" strip
    the whitespace that follows them in the text (RSTRIP), except "<unk>", "<s>", "<|endoftext|>"."""
    name = meta.get("general.name")
    if not isinstance(name, str) or not any(k in name.lower() for k in ("phi-3", "phi3")):
        return frozenset()
    ids = set(special_order)
    if "</s>" in token_to_id:
        ids.add(token_to_id["</s>"])
    return frozenset(ids - {token_to_id[t] for t in ("<unk>", "<s>", "<|endoftext|>") if t in token_to_id})


def _detect_special_tokens(texts: list[str], token_to_id: dict[str, int], attrs: list[int],
                           special: dict[str, int | None]) -> frozenset[int]:
    """llama.cpp's text-based detection of EOT/EOM/FIM tokens and of the EOG set (mutates attrs
    and special the same way). Where several texts match, the lowest id wins."""

    def present(candidates) -> list[int]:
        return sorted(token_to_id[t] for t in candidates if t in token_to_id)

    for name, candidates in _AUTODETECT.items():
        found = present(candidates)
        if special[name] is None and found:
            special[name] = found[0]
            attrs[found[0]] |= ATTR_CONTROL
    for i, a in enumerate(attrs):
        if a & ATTR_CONTROL and "unused" in texts[i]:
            attrs[i] |= ATTR_UNUSED

    eog = {special[k] for k in ("fim_pad", "fim_rep", "fim_sep") if special[k] is not None}
    for i in present(_EOG_TEXTS):
        eog.add(i)
        attrs[i] |= ATTR_CONTROL
    for i in present(_ALWAYS_RENDERED):
        attrs[i] = ATTR_USER_DEFINED
    eog.update(special[k] for k in ("eos", "eot", "eom") if special[k] is not None)

    by_text = {texts[i]: i for i in eog}
    has_call = "<|call|>" in by_text or "<|calls|>" in by_text
    # harmony / solar-open vocabularies: "<|end|>" ends a message, not the generation
    if "<|end|>" in by_text and has_call and ("<|return|>" in by_text or "<|flush|>" in by_text):
        end = by_text["<|end|>"]
        eog.discard(end)
        attrs[end] = ATTR_USER_DEFINED
    # gemma4 / paddleocr: "</s>" is an ordinary token there
    if "<|tool_response>" in by_text and "</s>" in by_text:
        s = by_text["</s>"]
        eog.discard(s)
        attrs[s] = ATTR_NORMAL
    return frozenset(eog)
