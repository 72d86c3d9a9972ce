"""`minfer inspect FILE`: what a GGUF file holds, from its validated header alone."""

from __future__ import annotations

import json
from collections import Counter
from typing import Any

from .errors import printable
from .gguf.reader import GGUFReader
from .models.support import SUPPORT, support

_SPECIAL_KEYS = ("bos", "eos", "eot", "eom", "unknown", "padding", "sep", "cls", "mask")


def summarize(r: GGUFReader) -> dict[str, Any]:
    """A JSON-ready summary of a GGUF file: architecture, sizes, quant mix, tokenizer."""
    arch = r.get_str("general.architecture", "unknown")

    def a(key: str, default=None):
        kv = r.kv.get(f"{arch}.{key}")
        return kv.value if kv is not None else default

    mix = Counter(t.ggml_type.name for t in r.tensors.values())
    tokens = r.metadata.get("tokenizer.ggml.tokens")
    specials = {}
    for name in _SPECIAL_KEYS:
        kv = r.kv.get(f"tokenizer.ggml.{name}_token_id")
        if kv is not None and isinstance(kv.value, int):
            tid = kv.value
            text = tokens[tid] if isinstance(tokens, list) and 0 <= tid < len(tokens) else None
            specials[name] = {"id": tid, "text": text}
    return {
        "file": str(r.path),
        "file_bytes": r.file_size,
        "gguf_version": r.version,
        "name": r.get_str("general.name", None) if r.kv.get("general.name") else None,
        "architecture": arch,
        "backends": support(arch),
        "n_layers": a("block_count"),
        "n_embd": a("embedding_length"),
        "n_ff": a("feed_forward_length"),
        "n_head": a("attention.head_count"),
        "n_head_kv": a("attention.head_count_kv"),
        "n_expert": a("expert_count"),  # a mixture of experts (None: a dense FFN)
        "n_expert_used": a("expert_used_count"),
        "n_ff_expert": a("expert_feed_forward_length"),
        "context_length": a("context_length"),
        "rope_freq_base": a("rope.freq_base"),
        "n_params": sum(t.n_elems for t in r.tensors.values()),
        "n_tensors": len(r.tensors),
        "tensor_bytes": sum(t.nbytes for t in r.tensors.values()),
        "quant_mix": dict(mix.most_common()),
        "tokenizer": {
            "model": r.metadata.get("tokenizer.ggml.model"),
            "pre": r.metadata.get("tokenizer.ggml.pre"),
            "n_vocab": len(tokens) if isinstance(tokens, list) else None,
            "add_bos": r.metadata.get("tokenizer.ggml.add_bos_token"),
            "special_tokens": specials,
        },
        "chat_template": "tokenizer.chat_template" in r.kv,
        "n_kv": len(r.kv),
    }


def tensor_rows(r: GGUFReader) -> list[dict[str, Any]]:
    return [
        {"name": t.name, "shape": list(t.shape), "type": t.ggml_type.name, "bytes": t.nbytes}
        for t in r.tensors.values()
    ]


def _fmt_count(n: int) -> str:
    for unit, div in (("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if n >= div:
            return f"{n / div:.2f}{unit}"
    return str(n)


def _show(x: Any) -> str:
    """A value read from the file, as the terminal may show it (control characters escaped)."""
    return printable(str(x))


def render_text(s: dict[str, Any], tensors: list[dict[str, Any]] | None) -> str:
    tok = s["tokenizer"]
    mix = ", ".join(f"{k} ×{v}" for k, v in s["quant_mix"].items())
    specials = ", ".join(f"{k}={v['id']} {v['text']!r}" for k, v in tok["special_tokens"].items())
    lines = [
        f"file           {_show(s['file'])} ({s['file_bytes'] / 2**20:.1f} MiB, GGUF v{s['gguf_version']})",
        f"name           {_show(s['name'])}",
        f"architecture   {_show(s['architecture'])}",
        "backends       " + (" · ".join(f"{b} {v}" for b, v in s["backends"].items()) if s["backends"] else
                             f"none: not a supported architecture ({', '.join(SUPPORT)})"),
        f"layers         {s['n_layers']}   d_model {s['n_embd']}   d_ff {s['n_ff']}   "
        f"heads {s['n_head']} (kv {s['n_head_kv']})",
        *([f"experts        {s['n_expert']} ({s['n_expert_used']} used a token"
            + (f", {s['n_ff_expert']} wide)" if s["n_ff_expert"] else ")")] if s["n_expert"] else []),
        f"context        {s['context_length']}   rope base {s['rope_freq_base']}",
        f"parameters     {_fmt_count(s['n_params'])} ({s['n_params']:,})",
        f"tensors        {s['n_tensors']} ({s['tensor_bytes'] / 2**20:.1f} MiB)",
        f"quant mix      {mix}",
        f"tokenizer      {_show(tok['model'])} (pre: {_show(tok['pre'])}), {tok['n_vocab']} tokens, "
        f"add_bos={tok['add_bos']}",
        f"special tokens {specials or '-'}",
        f"chat template  {'yes' if s['chat_template'] else 'no'}",
    ]
    if tensors is not None:
        w = max((len(_show(t["name"])) for t in tensors), default=4)
        lines.append("")
        lines.append(f"{'name':<{w}}  {'shape':<20} {'type':<6} {'bytes':>12}")
        for t in tensors:
            lines.append(f"{_show(t['name']):<{w}}  {str(t['shape']):<20} {t['type']:<6} {t['bytes']:>12,}")
    return "\n".join(lines)


def inspect_file(path, *, tensors: bool = False, as_json: bool = False) -> str:
    with GGUFReader(path) as r:
        s = summarize(r)
        rows = tensor_rows(r) if tensors else None
    if as_json:
        if rows is not None:
            s["tensors"] = rows
        return json.dumps(s, indent=2)
    return render_text(s, rows)
