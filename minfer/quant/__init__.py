"""ggml quant types: the table (types.py) and the torch reference codecs (reference.py)."""

from .types import QUANT_TABLE, GGMLType, QuantInfo, by_name, quant_info

__all__ = ["QUANT_TABLE", "GGMLType", "QuantInfo", "by_name", "quant_info"]
