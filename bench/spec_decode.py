"""Speculative decoding (prompt lookup, `--spec ngram`) against plain decoding, one process, one model file.

For every prompt of bench/spec_prompts.json's two sets (copy: outputs that repeat their input; free:
outputs where drafts mostly fail), the chat is generated greedily with drafts off and on, alternating
(off, on, off, on, ...: a slow moment of a shared machine hits both), `--reps` times. Prints per set:
decode tok/s off and on (total decode tokens / total decode seconds, the medians over repetitions),
their ratio, the drafts proposed and kept, and whether every greedy text was identical; JSON last.

    python bench/spec_decode.py [--model FILE] [--device cpu] [--threads 2] [--max-tokens 128] [--reps 3]
"""
from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

from minfer.api import load
from minfer.engine.params import SamplingParams

HERE = Path(__file__).resolve().parent


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=None)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--draft-max", type=int, default=8)
    a = ap.parse_args()
    sets = json.loads((HERE / "spec_prompts.json").read_text())
    kw = dict(n_ctx=1024, n_slots=1, progress=False, threads=a.threads)
    models = {"off": load(a.model, a.device, **kw), "on": load(a.model, a.device, spec="ngram", draft_max=a.draft_max,
                                                               **kw)}
    params = SamplingParams(max_tokens=a.max_tokens, temperature=0)
    for m in models.values():  # (warm-up: the first step's one-time costs)
        m.run([m.submit([{"role": "user", "content": "hi"}], SamplingParams(max_tokens=4, temperature=0))])
    report = {}
    for name in ("copy", "free"):
        rates = {"off": [], "on": []}
        same, drafted, kept = True, 0, 0
        for _ in range(a.reps):
            tok = {"off": 0, "on": 0}
            sec = {"off": 0.0, "on": 0.0}
            for prompt in sets[name]:
                msgs = [{"role": "user", "content": prompt}]
                out = {}
                for mode in ("off", "on"):
                    m = models[mode]
                    m.reset()  # (no reused prefix: both run the whole prompt)
                    seq = m.submit(msgs, params)
                    m.run([seq])
                    out[mode] = seq.generated
                    tok[mode] += len(seq.generated) - 1
                    sec[mode] += seq.stats.decode_seconds
                    if mode == "on":
                        drafted += seq.stats.draft_tokens
                        kept += seq.stats.draft_accepted
                same &= out["off"] == out["on"]
            for mode in rates:
                rates[mode].append(tok[mode] / sec[mode])
        off, on = statistics.median(rates["off"]), statistics.median(rates["on"])
        report[name] = {"off_tok_s": round(off, 1), "on_tok_s": round(on, 1), "ratio": round(on / off, 3),
                        "drafts": drafted // a.reps, "kept": kept // a.reps, "identical_greedy": same}
        print(f"{name:5s} off {off:7.1f} tok/s  on {on:7.1f} tok/s  x{on / off:.2f}  drafts kept "
              f"{kept // a.reps}/{drafted // a.reps}  identical greedy: {same}", flush=True)
    for m in models.values():
        m.close()
    print(json.dumps({"device": a.device, "threads": a.threads, "max_tokens": a.max_tokens, "reps": a.reps, **report}))


if __name__ == "__main__":
    main()
