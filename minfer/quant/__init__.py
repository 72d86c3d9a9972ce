"""ggml quant types: the table (types.py) and the torch reference codecs (reference.py).

`dequantize` / `quantize` are imported on first use, so code that only needs the table
(the GGUF reader, `minfer inspect`) does not pay for importing torch.
"""

from .types import QUANT_TABLE, GGMLType, QuantInfo, by_name, quant_info

__all__ = ["QUANT_TABLE", "GGMLType", "QuantInfo", "by_name", "dequantize", "quant_info", "quantize"]


def __getattr__(name: str):
    if name in ("dequantize", "quantize"):
        from . import reference

        return getattr(reference, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
