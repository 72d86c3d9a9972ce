"""The trace file format: its name, version and JSON schema (docs/TRACE-FORMAT.md explains it).

The schema is a plain JSON-Schema (draft 2020-12) dict so that tests, and anyone consuming traces,
can validate a file with a standard validator; minfer's runtime only needs `check_header`.
"""

from __future__ import annotations

import json
from pathlib import Path

from ..errors import MinferError

FORMAT = "minfer-trace"
VERSION = 2

_NUM = {"type": ["number", "null"]}
_INT = {"type": "integer", "minimum": 0}


def _column(item: dict) -> dict:
    return {"type": "array", "items": item}


NODE_SCHEMA = {
    "type": "object",
    "required": ["id", "name", "op", "inputs", "shape", "dtype", "layer", "kernel"],
    "properties": {
        "id": _INT,
        "name": {"type": "string"},
        "op": {"type": "string"},
        "inputs": _column(_INT),
        "shape": _column({"type": ["integer", "string"]}),
        "dtype": {"type": "string"},
        "layer": {"type": ["integer", "null"]},
        "kernel": {"type": ["string", "null"]},
    },
}

HEATMAP_SCHEMA = {
    "type": "object",
    "required": ["rows", "cols", "h", "w", "lo", "hi", "data"],
    "additionalProperties": False,
    "properties": {
        "rows": _INT,
        "cols": _INT,
        "h": {"type": "integer", "minimum": 1},
        "w": {"type": "integer", "minimum": 1},
        "lo": {"type": "number"},
        "hi": {"type": "number"},
        "data": {"type": "string", "pattern": "^[A-Za-z0-9+/]*={0,2}$"},
    },
}

_TOKEN = {
    "oneOf": [
        {"type": "null"},
        {
            "type": "object",
            "required": ["id", "text", "prob", "logit", "rank"],
            "additionalProperties": False,
            "properties": {"id": _INT, "text": {"type": "string"}, "prob": _NUM, "logit": _NUM,
                           "rank": {"type": ["integer", "null"], "minimum": 0}},
        },
    ]
}
_TOP = {
    "oneOf": [
        {"type": "null"},
        {
            "type": "object",
            "required": ["ids", "probs", "logits", "texts"],
            "additionalProperties": False,
            "properties": {"ids": _column(_INT), "probs": _column(_NUM), "logits": _column(_NUM),
                           "texts": {"type": ["array", "null"], "items": {"type": "string"}}},
        },
    ]
}

STEP_SCHEMA = {
    "type": "object",
    "required": ["step", "kind", "n_tokens", "seconds", "nodes", "kernels", "heatmap_step", "heatmaps",
                 "token", "entropy", "top", "tokens"],
    "additionalProperties": False,
    "properties": {
        "step": _INT,
        "kind": {"enum": ["prefill", "decode", "mixed"]},
        "n_tokens": _INT,
        "seconds": {"type": "number", "minimum": 0},
        "nodes": {
            "type": "object",
            "required": ["id", "seconds", "shape", "numel", "min", "max", "mean", "std", "nan", "inf"],
            "additionalProperties": False,
            "properties": {
                "id": _column(_INT),
                "seconds": _column({"type": "number", "minimum": 0}),
                "shape": _column(_column(_INT)),
                "numel": _column(_INT),
                "min": _column(_NUM),
                "max": _column(_NUM),
                "mean": _column(_NUM),
                "std": _column(_NUM),
                "nan": _column(_INT),
                "inf": _column(_INT),
            },
        },
        "kernels": {"type": "object", "patternProperties": {"^[0-9]+$": {"type": "string"}},
                    "additionalProperties": False},
        "heatmap_step": {"type": "boolean"},
        "heatmaps": {"type": "object", "patternProperties": {"^[0-9]+$": HEATMAP_SCHEMA},
                     "additionalProperties": False},
        "token": _TOKEN,
        "entropy": _NUM,
        "top": _TOP,
        "tokens": _column({
            "type": "object",
            "required": ["seq", "token", "entropy", "top"],
            "additionalProperties": False,
            "properties": {"seq": _INT, "token": _TOKEN, "entropy": _NUM, "top": _TOP},
        }),
    },
}

TRACE_SCHEMA = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "title": "minfer trace",
    "type": "object",
    "required": ["format", "version", "created", "model", "settings", "graph", "steps", "heatmap_bytes",
                 "heatmaps_dropped"],
    "additionalProperties": False,
    "properties": {
        "format": {"const": FORMAT},
        "version": {"const": VERSION},
        "created": {"type": "string"},
        "model": {"type": "object"},
        "settings": {
            "type": "object",
            "required": ["heatmap_max", "top_k", "heatmap_first", "heatmap_every", "heatmap_budget"],
            "properties": {k: _INT for k in
                           ("heatmap_max", "top_k", "heatmap_first", "heatmap_every", "heatmap_budget")},
        },
        "graph": _column(NODE_SCHEMA),
        "steps": _column(STEP_SCHEMA),
        "heatmap_bytes": _INT,
        "heatmaps_dropped": _INT,
    },
}


def check_header(doc: object, source: str) -> dict:
    """Cheap check that `doc` is a trace this version understands; returns it as a dict."""
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise MinferError(f"{source}: not a minfer trace (expected \"format\": \"{FORMAT}\")")
    if doc.get("version") != VERSION:
        raise MinferError(f"{source}: trace version {doc.get('version')!r}, this minfer reads version {VERSION}")
    if not isinstance(doc.get("graph"), list) or not isinstance(doc.get("steps"), list):
        raise MinferError(f"{source}: trace lacks its \"graph\" or \"steps\" list")
    return doc


def load_trace(path: str | Path) -> dict:
    """Read and header-check a trace file. Errors are MinferError with the path and the reason."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as e:
        raise MinferError(f"{p}: cannot read trace: {e.strerror or e}") from None
    except UnicodeDecodeError:
        raise MinferError(f"{p}: not a minfer trace (not UTF-8 JSON)") from None
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as e:
        raise MinferError(f"{p}: not valid JSON at line {e.lineno} column {e.colno}: {e.msg}") from None
    return check_header(doc, str(p))
