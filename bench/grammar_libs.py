"""llguidance vs xgrammar on this engine's tokenizer: what docs/SERVER.md's choice rests on.

    python bench/grammar_libs.py [-m MODEL.gguf]            # default: SmolLM2's 49,152-token vocabulary
    PYTHONPATH=.:/tmp/xg python bench/grammar_libs.py       # xgrammar installed apart (pip install --target
                                                            # /tmp/xg --no-deps xgrammar apache-tvm-ffi)

For each of the 20 schemas of tests/server/test_structured.py: the time to compile the schema
and compute its first mask (llguidance: the grammar and its matcher, built lazily; xgrammar:
compile_json_schema), and the time of each later token mask, over one valid answer (a random
walk through llguidance's masks: the same tokens fed to both). Also the import time. One thread
each (the engine computes a batch's masks in parallel; this measures one row).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import random
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests" / "server"))

from test_structured import SCHEMAS  # noqa: E402

from minfer.default_model import default_model_path  # noqa: E402
from minfer.engine.grammar import JSON_OPTIONS, ll_tokenizer  # noqa: E402
from minfer.tokenizer import Tokenizer  # noqa: E402


def walk(lt, tok, schema: dict, rng: random.Random, limit: int = 120) -> list[int]:
    """A valid token path: each step a random allowed token of plain ASCII letters, digits and
    JSON punctuation where there is one (what a model writes), an end token half the time once
    the grammar allows one."""
    import llguidance as llg

    m = llg.LLMatcher(lt, llg.LLMatcher.grammar_from_json_schema(schema, defaults=JSON_OPTIONS))
    bits = torch.zeros((lt.vocab_size + 31) // 32, dtype=torch.int32)
    out: list[int] = []
    eos = set(lt.eos_tokens)
    while len(out) < limit and not m.is_stopped():
        m.unsafe_compute_mask_ptr(bits.data_ptr(), bits.numel() * 4)
        allowed = ((bits[:, None] >> torch.arange(32)) & 1).flatten().nonzero().flatten().tolist()
        allowed = [t for t in allowed if t < lt.vocab_size]
        if eos & set(allowed) and (len(allowed) == len(eos & set(allowed)) or rng.random() < 0.5):
            break
        plain = [t for t in allowed if t not in eos and tok.token_to_piece(t).isascii()
                 and tok.token_to_piece(t).strip(b'{}[]:,"').isalnum()]
        t = rng.choice(plain or [t for t in allowed if t not in eos])
        assert m.consume_token(t)
        out.append(t)
    return out


def time_llguidance(lt, schema: dict, path: list[int]) -> tuple[float, list[float]]:
    import llguidance as llg

    t0 = time.perf_counter()
    m = llg.LLMatcher(lt, llg.LLMatcher.grammar_from_json_schema(schema, defaults=JSON_OPTIONS))
    bits = torch.zeros((lt.vocab_size + 31) // 32, dtype=torch.int32)
    m.unsafe_compute_mask_ptr(bits.data_ptr(), bits.numel() * 4)  # (llguidance builds its lexer lazily: the
    compile_s = time.perf_counter() - t0  # first mask is part of the compile)
    masks = []
    for t in path:
        t0 = time.perf_counter()
        m.unsafe_compute_mask_ptr(bits.data_ptr(), bits.numel() * 4)
        masks.append(time.perf_counter() - t0)
        assert m.consume_token(t)
    return compile_s, masks


def time_xgrammar(compiler, info, schema: dict, path: list[int]) -> tuple[float, list[float]]:
    import xgrammar as xgr

    t0 = time.perf_counter()
    compiled = compiler.compile_json_schema(json.dumps(schema), any_whitespace=False, separators=(",", ":"))
    m = xgr.GrammarMatcher(compiled)
    bits = xgr.allocate_token_bitmask(1, info.vocab_size)
    m.fill_next_token_bitmask(bits)
    compile_s = time.perf_counter() - t0
    masks = []
    for t in path:
        t0 = time.perf_counter()
        m.fill_next_token_bitmask(bits)
        masks.append(time.perf_counter() - t0)
        if not m.accept_token(t):
            return compile_s, masks  # (a path the two grammars' whitespace rules disagree on: timed this far)
    return compile_s, masks


def summary(name: str, compiles: list[float], masks: list[float]) -> str:
    us = sorted(x * 1e6 for x in masks)
    return (f"| {name} | {statistics.median(compiles) * 1e3:.2f} | {max(compiles) * 1e3:.1f} "
            f"| {statistics.mean(us):.0f} | {us[len(us) // 2]:.0f} | {us[int(len(us) * 0.99)]:.0f} | {len(us)} |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-m", "--model", default=None)
    args = ap.parse_args()
    torch.set_num_threads(1)
    tok = Tokenizer.from_gguf(args.model or default_model_path())
    t0 = time.perf_counter()
    import llguidance  # noqa: F401

    ll_import = time.perf_counter() - t0
    t0 = time.perf_counter()
    lt = ll_tokenizer(tok)
    ll_tok_s = time.perf_counter() - t0
    rng = random.Random(0)
    paths = [walk(lt, tok, s, rng) for _, s in SCHEMAS]
    rows = ["| library | compile ms (median) | compile ms (max) | mask µs mean | p50 | p99 | tokens |",
            "|---|---:|---:|---:|---:|---:|---:|"]
    c, mk = [], []
    for (_, s), p in zip(SCHEMAS, paths, strict=True):
        a, b = time_llguidance(lt, s, p)
        c.append(a)
        mk += b
    rows.append(summary(f"llguidance (import {ll_import:.2f} s, tokenizer {ll_tok_s:.2f} s)", c, mk))
    if importlib.util.find_spec("xgrammar") is not None:
        t0 = time.perf_counter()
        import xgrammar as xgr

        xg_import = time.perf_counter() - t0
        t0 = time.perf_counter()
        pieces = [tok.token_to_piece(i, special=True) for i in range(tok.n_vocab)]
        info = xgr.TokenizerInfo(pieces, vocab_type=xgr.VocabType.RAW, stop_token_ids=sorted(tok.eot_ids))
        compiler = xgr.GrammarCompiler(info, max_threads=1, cache_enabled=False)
        xg_tok_s = time.perf_counter() - t0
        c, mk = [], []
        for (_, s), p in zip(SCHEMAS, paths, strict=True):
            a, b = time_xgrammar(compiler, info, s, p)
            c.append(a)
            mk += b
        rows.append(summary(f"xgrammar (import {xg_import:.2f} s, tokenizer {xg_tok_s:.2f} s)", c, mk))
    else:
        rows.append("| xgrammar | not installed | | | | | |")
    print(f"vocabulary: {tok.n_vocab} tokens; {len(SCHEMAS)} schemas, {sum(map(len, paths))} tokens in all")
    print("\n".join(rows))


if __name__ == "__main__":
    main()
