"""minfer: an LLM inference engine for GGUF files.

    import minfer
    model = minfer.load()          # the default SmolLM2 model, cpu backend (see minfer.api)

`load` is imported on first use so that commands which need no torch (inspect, trace view)
start fast.
"""

__version__ = "0.1.0"
__all__ = ["load"]


def __getattr__(name: str):
    if name == "load":
        from .api import load

        return load
    raise AttributeError(f"module 'minfer' has no attribute {name!r}")
