"""GGUF tokenizers (byte-level BPE with llama.cpp's pre-tokenizers, SentencePiece) and chat templates.

The names below are imported on first use: `minfer.tokenizer.templates` (the built-in template
names `--help` lists) loads nothing else, and `render_chat` (chat.py) brings jinja2, which a run
that renders no template (`minfer run PROMPT`) never needs."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .chat import render_chat
    from .tokenizer import StreamDecoder, Tokenizer

__all__ = ["StreamDecoder", "Tokenizer", "render_chat"]
_HOME = {"StreamDecoder": ".tokenizer", "Tokenizer": ".tokenizer", "render_chat": ".chat"}


def __getattr__(name: str):
    if name in _HOME:
        return getattr(importlib.import_module(_HOME[name], __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
