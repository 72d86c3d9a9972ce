"""minfer: an LLM inference engine for GGUF files."""

__version__ = "0.1.0"
