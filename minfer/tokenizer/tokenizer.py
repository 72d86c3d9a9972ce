"""Text <-> token ids for a GGUF model, matching llama.cpp's `llama_tokenize` / `llama_detokenize`.

Encoding (llama.cpp `llama_vocab::impl::tokenize`):
1. special-token partition: the text is split around occurrences of special tokens, longest
   token text first. User-defined tokens are always matched; control and unknown tokens only
   when `parse_special=True` (otherwise "<|im_start|>" is ordinary text);
2. each plain-text fragment goes through the model's tokenizer: byte-level BPE after the
   pre-tokenizer ("gpt2"), or SentencePiece merges with a leading space and "▁" for spaces
   ("llama");
3. BOS/EOS are added when `add_special` and the model's flags say so.

Decoding concatenates each token's bytes (control tokens only with `special=True`) and, for the
vocabularies that ask for it, applies llama.cpp's clean-up of spaces before punctuation.
"""

from __future__ import annotations

import codecs
import operator
import os
import re
from collections.abc import Iterable, Mapping
from typing import Any

from ..errors import TokenizerError
from ..gguf.reader import GGUFReader
from .bpe import BytePairEncoder, SentencePieceEncoder
from .templates import builtin_template
from .unicode import CHAR_TO_BYTE
from .vocab import (
    ATTR_BYTE,
    ATTR_CONTROL,
    ATTR_NORMAL,
    ATTR_UNKNOWN,
    ATTR_USER_DEFINED,
    Vocab,
    load_vocab,
)

_SPM_SPACE = "\u2581"  # "▁"
_C_SPACE = " \t\n\v\f\r"  # C's isspace(), which llama.cpp's strip attributes use
_HIDDEN_UNLESS_SPECIAL = ATTR_CONTROL | ATTR_UNKNOWN


class Tokenizer:
    """A GGUF model's tokenizer. Build it with `from_metadata` (or `from_gguf`)."""

    def __init__(self, vocab: Vocab):
        self._v = vocab
        if vocab.model == "gpt2":
            self._bpe = BytePairEncoder(vocab.token_to_id, vocab.ranks, vocab.pre.ignore_merges)
        else:
            self._spm = SentencePieceEncoder(vocab.token_to_id, vocab.scores, self._spm_byte_ids())
        self._pieces: dict[tuple[int, bool], bytes] = {}
        self._template = vocab.chat_template or builtin_template(vocab.token_to_id)
        self._render = None  # render_chat, or isolate_templates' worker (chat.py: jinja2, imported when used)

    @classmethod
    def from_metadata(cls, meta: Mapping[str, Any]) -> Tokenizer:
        """From GGUF metadata: key -> python value, arrays as lists (GGUFReader(path).metadata)."""
        return cls(load_vocab(meta))

    @classmethod
    def from_gguf(cls, path: str | os.PathLike) -> Tokenizer:
        with GGUFReader(path) as reader:
            return cls.from_metadata(reader.metadata)

    # ------------------------------------------------------------------ properties
    @property
    def kind(self) -> str:
        """`tokenizer.ggml.model`: "gpt2" (byte-level BPE) or "llama" (SentencePiece)."""
        return self._v.model

    @property
    def pre(self) -> str | None:
        """Pre-tokenizer variant in use (gpt2 only)."""
        return self._v.pre.name if self._v.pre else None

    @property
    def n_vocab(self) -> int:
        return len(self._v.texts)

    @property
    def bos_id(self) -> int | None:
        return self._v.special["bos"]

    @property
    def eos_id(self) -> int | None:
        return self._v.special["eos"]

    def special_id(self, name: str) -> int | None:
        """A special token's id by its role (bos, eos, eot, fim_pre, fim_suf, fim_mid, ...), or None."""
        return self._v.special.get(name)

    @property
    def eot_ids(self) -> frozenset[int]:
        """Ids that end generation (llama.cpp's EOG set: eos, eot, eom, <|im_end|>-style tokens)."""
        return self._v.eog_ids

    @property
    def add_bos(self) -> bool:
        return self._v.add_bos

    @property
    def add_eos(self) -> bool:
        return self._v.add_eos

    @property
    def add_space_prefix(self) -> bool:
        """SPM-style leading space: added before text when encoding, stripped from the first
        token when decoding."""
        return self._v.add_space_prefix

    @property
    def chat_template(self) -> str | None:
        return self._template

    def set_chat_template(self, source: str) -> None:
        """Use `source` (Jinja) instead of the file's chat template; compiled now, so a bad one is
        a TemplateError here rather than at the first chat."""
        from .chat import ChatTemplate

        ChatTemplate(source)
        self._template = source

    def isolate_templates(self, worker) -> None:
        """Render the chat template through `worker` (render_worker.RenderWorker: a child process
        under memory and CPU limits) instead of in this process; what the server does with a
        model file's template."""
        self._render = worker.render

    @property
    def vocab_attrs(self) -> list[int]:
        """Every token's attribute bits (vocab.py ATTR_*: normal, control, user-defined, byte ...)."""
        return self._v.attrs

    def is_eog(self, token_id: int) -> bool:
        return token_id in self._v.eog_ids

    def token_text(self, token_id: int) -> str:
        """The token's text as stored in the vocabulary (e.g. "Ġworld", "<|im_end|>")."""
        return self._v.texts[self._check_id(token_id)]

    # ------------------------------------------------------------------ encoding
    def encode(self, text: str, add_special: bool = True, parse_special: bool = False) -> list[int]:
        """Token ids of `text`. `add_special`: add BOS/EOS as the model's flags say.
        `parse_special`: match control tokens ("<|im_start|>") in the text."""
        if not isinstance(text, str):
            raise TokenizerError(f"encode() needs a str, got {type(text).__name__}")
        v = self._v
        out: list[int] = []
        if add_special and v.add_bos:
            out.append(v.special["bos"])
        fragments = self._partition(text, parse_special)
        if v.model == "gpt2":
            for frag in fragments:
                if isinstance(frag, int):
                    out.append(frag)
                else:
                    for word in v.pre.split(frag):
                        out.extend(self._bpe.encode_word(word))
        else:
            prev_special = True
            for frag in fragments:
                if isinstance(frag, int):
                    out.append(frag)
                    prev_special = True
                    continue
                if v.add_space_prefix and prev_special:
                    frag = " " + frag
                self._spm.encode(frag.replace(" ", _SPM_SPACE), out)
                prev_special = False
        if add_special and v.add_eos:
            out.append(v.special["eos"])
        return out

    def _partition(self, text: str, parse_special: bool) -> list[str | int]:
        """Split around special tokens, longest first (llama.cpp tokenizer_st_partition)."""
        v = self._v
        frags: list[str | int] = [text] if text else []
        for tid in v.special_order:
            if not parse_special and v.attrs[tid] & _HIDDEN_UNLESS_SPECIAL:
                continue
            tok = v.texts[tid]
            if not any(isinstance(f, str) and tok in f for f in frags):
                continue
            new: list[str | int] = []
            for f in frags:
                if isinstance(f, int) or tok not in f:
                    new.append(f)
                    continue
                for k, part in enumerate(f.split(tok)):
                    if k:
                        new.append(tid)
                        if tid in v.rstrip_ids:  # the whitespace after it is dropped (phi3)
                            part = part.lstrip(_C_SPACE)
                    if part:
                        new.append(part)
            frags = new
        return frags

    def _spm_byte_ids(self) -> list[int | None]:
        """Byte -> token for SPM byte fallback: "<0xNN>", else the raw byte as a token, else unk."""
        ids = self._v.token_to_id
        unk = self._v.special["unk"]
        table = []
        for b in range(256):
            raw = chr(b) if b < 0x80 else chr(0xDC00 + b)  # GGUF strings keep bad UTF-8 as surrogates
            tid = ids.get(f"<0x{b:02X}>", ids.get(raw, unk))
            table.append(tid)
        return table

    # ------------------------------------------------------------------ decoding
    def _check_id(self, token_id: Any) -> int:
        """The id as a python int (numpy/torch integer scalars accepted), or TokenizerError."""
        try:
            tid = operator.index(token_id) if not isinstance(token_id, bool) else -1
        except TypeError:
            tid = -1
        if not 0 <= tid < len(self._v.texts):
            raise TokenizerError(f"token id {token_id!r} is outside the vocabulary (0..{len(self._v.texts) - 1})")
        return tid

    def token_to_piece(self, token_id: int, special: bool = False) -> bytes:
        """The bytes one token stands for. Control/unknown tokens give b"" unless `special`.
        A piece can be part of a UTF-8 character (byte tokens, split emoji)."""
        token_id = self._check_id(token_id)
        key = (token_id, special)
        piece = self._pieces.get(key)
        if piece is None:
            piece = self._pieces[key] = self._piece(token_id, special)
        return piece

    def _piece(self, tid: int, special: bool) -> bytes:
        v = self._v
        attr, text = v.attrs[tid], v.texts[tid]
        if attr & _HIDDEN_UNLESS_SPECIAL and not special:
            return b""
        raw = text.encode("utf-8", "surrogateescape")
        if attr & (_HIDDEN_UNLESS_SPECIAL | ATTR_USER_DEFINED):
            return raw
        if attr & ATTR_NORMAL:
            if v.model == "llama":
                return text.replace(_SPM_SPACE, " ").encode("utf-8", "surrogateescape")
            out = bytearray()
            for ch in text:
                b = CHAR_TO_BYTE.get(ch)
                if b is not None:
                    out.append(b)
                else:  # not a byte-alphabet character: llama.cpp's marker
                    hexed = "".join(f"{x:02x}" for x in ch.encode("utf-8", "surrogateescape"))
                    out += f"[UNK_BYTE_0x{hexed}".encode() + raw + b"]"
            return bytes(out)
        if attr & ATTR_BYTE and len(text) == 6 and text.startswith("<0x"):
            try:
                return bytes([int(text[3:5], 16)])
            except ValueError:
                return b""
        return b""

    def decode(self, ids: Iterable[int], special: bool = False) -> str:
        """Text of a token sequence (llama.cpp llama_detokenize with remove_special=False).
        Bytes that do not form valid UTF-8 become U+FFFD."""
        data = bytearray()
        strip_space = self._v.add_space_prefix
        for tid in ids:
            piece = self.token_to_piece(tid, special)
            if strip_space and piece.startswith(b" "):
                piece = piece[1:]
            strip_space = False
            data += piece
        if self._v.clean_spaces:
            data = _clean_spaces(bytes(data))
        return bytes(data).decode("utf-8", "replace")

    def stream_decoder(self, special: bool = False) -> StreamDecoder:
        return StreamDecoder(self, special)

    def apply_chat_template(self, messages: list[dict], add_generation_prompt: bool = True, **extra) -> str:
        """Render `messages` with the model's chat template (ChatML if it has none)."""

        def text_of(tid: int | None) -> str:
            return self._v.texts[tid] if tid is not None else ""

        from .chat import render_chat

        render = render_chat if self._template is None or self._render is None else self._render  # (ChatML: ours)
        return render(self._template, messages, add_generation_prompt=add_generation_prompt,
                      bos_token=text_of(self.bos_id), eos_token=text_of(self.eos_id), **extra)


_SPACE_BEFORE_PUNCT = re.compile(rb" (?=[?!.,])")
_SPACE_BEFORE_CONTRACTION = re.compile(rb" '(?=s|m|re|ve)")


def _clean_spaces(data: bytes) -> bytes:
    """llama.cpp's three clean-up passes (clean_up_tokenization_spaces): " ?"/" !"/" ."/" ," lose
    the space, " ' " becomes "'", and " 's", " 'm", " 're", " 've" lose the space."""
    data = _SPACE_BEFORE_PUNCT.sub(b"", data)
    data = data.replace(b" ' ", b"'")
    return _SPACE_BEFORE_CONTRACTION.sub(b"'", data)


class StreamDecoder:
    """Incremental detokenizer for generation: feed ids as they come, get text pieces.

    Never emits part of a UTF-8 character: an incomplete trailing sequence is held until the
    next token completes it; `flush()` at the end emits what is left (U+FFFD for bytes that
    never formed a character). Like llama.cpp's per-token streaming, no space clean-up is done.
    """

    def __init__(self, tokenizer: Tokenizer, special: bool = False):
        self._tok = tokenizer
        self._special = special
        self._utf8 = codecs.getincrementaldecoder("utf-8")("replace")
        self._strip_space = tokenizer.add_space_prefix

    def feed(self, ids: int | Iterable[int]) -> str:
        """Text completed by these tokens (one id or several); may be "" while a character is open."""
        try:
            ids = (operator.index(ids),)
        except TypeError:
            pass
        data = bytearray()
        for tid in ids:
            piece = self._tok.token_to_piece(tid, self._special)
            if self._strip_space and piece.startswith(b" "):
                piece = piece[1:]
            self._strip_space = False
            data += piece
        return self._utf8.decode(bytes(data))

    def flush(self) -> str:
        return self._utf8.decode(b"", final=True)
