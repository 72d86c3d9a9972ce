"""Small decode batches on cuda against each row alone, on a real-shape file (a GPU check, not a test).

    python bench/small_batch_check.py MODEL.gguf

Four sequences are prefilled in four slots; then one decode step of 2, 3 and 4 rows together (the ways
"rows2" and "rows4": the GEMVs' row programs on the large weights, cuBLAS on the f16 copy elsewhere) and
each row's step alone (the one-row way) are compared: the largest relative difference of a row's
logits, and whether the argmax agrees. Prints the kernels each way picked for the first layer's
projections. Exits 1 when a row is further than 1e-2 from itself alone or its argmax differs.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main(argv: list[str]) -> int:
    from minfer.api import load
    from minfer.backends.base import Batch
    from minfer.backends.cuda.graphs import DECODE_KINDS

    prompts = [[11 + 7 * i + j for j in range(5 + 3 * i)] for i in range(4)]
    bad = 0
    with load(argv[0], "cuda", n_ctx=256, n_slots=4, progress=False) as m:
        be = m.engine.backend
        for kind, most in DECODE_KINDS:
            picked = [r for r in be.compiler.plan_rows(kind, most)
                      if r["layer"] == 0 and "MatMul" in r["op"]]
            print(kind, ", ".join(f"{r['name']}: {r['kernel']}" for r in picked))
        for rows in (2, 3, 4):
            for slot, toks in enumerate(prompts):
                be.forward(Batch.single(toks, 0, slot=slot))
            seqs = [(s, len(prompts[s]), [100 + s]) for s in range(rows)]
            together = be.forward(Batch.build(seqs, list(range(rows)), n_decode=rows)).float().cpu()
            for i, (s, n, t) in enumerate(seqs):
                alone = be.forward(Batch.build([(s, n, t)], [0], n_decode=1)).float().cpu()[0]
                rel = float((together[i] - alone).abs().max() / alone.abs().max())
                same = int(together[i].argmax()) == int(alone.argmax())
                bad += rel > 1e-2 or not same
                print(f"rows {rows} row {i}: rel {rel:.2e} argmax {'same' if same else 'DIFFERS'}")
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
