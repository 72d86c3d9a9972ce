"""GGUF tokenizers (byte-level BPE with llama.cpp's pre-tokenizers, SentencePiece) and chat templates."""

from .chat import render_chat
from .tokenizer import StreamDecoder, Tokenizer

__all__ = ["StreamDecoder", "Tokenizer", "render_chat"]
