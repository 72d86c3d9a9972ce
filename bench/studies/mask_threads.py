"""Where a B=16 grammar step's host time goes on the GPU machine (issue 28: structured outputs <= 10 %
of decode tok/s): the CPUs this process may use, llguidance's mask computation for 16 rows through
its executor (default threads, 4, 1) and one matcher after another in the calling thread, then the
structured bench at B=16 with the engine's masks computed each way.

    PYTHONPATH=.:/tmp/pylib python3 bench/studies/mask_threads.py MODEL.gguf
"""
import os
import sys
import time
from pathlib import Path

import llguidance
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
import structured  # noqa: E402

from minfer.api import load  # noqa: E402
from minfer.engine import masks as masks_mod  # noqa: E402
from minfer.engine.grammar import Grammar, Matcher  # noqa: E402

path, device = sys.argv[1], (sys.argv[2] if len(sys.argv) > 2 else "cuda")
cpu_max = Path("/sys/fs/cgroup/cpu.max")
print(f"os.cpu_count {os.cpu_count()}, affinity {len(os.sched_getaffinity(0))}, "
      f"cgroup cpu.max {cpu_max.read_text().strip() if cpu_max.exists() else 'n/a'}")
model = load(path, device, n_slots=16, n_ctx=320, progress=False)
tok, V = model.tokenizer, model.engine.n_vocab
W = (V + 31) // 32
ms = [Matcher(Grammar.json_schema(structured.SCHEMA), tok, V) for _ in range(16)]
for m in ms:
    for t in tok.encode('["hello","wor', add_special=False):
        assert m.consume(t)
bits = torch.empty(16, W, dtype=torch.int32, pin_memory=device == "cuda")
pairs = [(m.inner, i) for i, m in enumerate(ms)]
for n in (None, 4, 1):
    ex = llguidance.LLExecutor(n) if n else llguidance.LLExecutor()
    for _ in range(5):
        ex.unsafe_compute_mask_ptr(pairs, bits.data_ptr(), W * 4, 16)
    t = time.perf_counter()
    for _ in range(100):
        ex.unsafe_compute_mask_ptr(pairs, bits.data_ptr(), W * 4, 16)
    print(f"executor threads {n or 'default'}: {(time.perf_counter() - t) * 10:.3f} ms for 16 rows")
t = time.perf_counter()
for _ in range(100):
    for i, m in enumerate(ms):
        m.inner.unsafe_compute_mask_ptr(bits.data_ptr() + i * W * 4, W * 4)
print(f"one after another: {(time.perf_counter() - t) * 10:.3f} ms for 16 rows")

# the engine's step at B=16, with the host's parts timed
real_rows = masks_mod.Masks.rows
spent = {"masks": 0.0, "post": 0.0, "wait": 0.0, "n": 0}


def serial_rows(self, matchers, n_vocab):
    b = self._bits(len(matchers), (n_vocab + 31) // 32)
    b.fill_(-1)
    for i, m in enumerate(matchers):
        if m is not None:
            m.inner.unsafe_compute_mask_ptr(b.data_ptr() + i * b.shape[1] * 4, b.shape[1] * 4)
    return b


sched = model.engine.scheduler
real_post = sched.postprocess


def timed_post(*a, **k):
    t = time.perf_counter()
    out = real_post(*a, **k)
    spent["post"] += time.perf_counter() - t
    spent["n"] += 1
    return out


sched.postprocess = timed_post
for name, fn in (("executor", real_rows), ("one after another", serial_rows)):
    def timed_rows(self, matchers, n_vocab, fn=fn):
        t = time.perf_counter()
        out = fn(self, matchers, n_vocab)
        spent["masks"] += time.perf_counter() - t
        return out

    masks_mod.Masks.rows = timed_rows
    structured.decode_rate(model, 16, 32, structured.SCHEMA)
    free = structured.decode_rate(model, 16, 256, None)[0]
    spent.update(masks=0.0, post=0.0, n=0)
    guided = structured.decode_rate(model, 16, 256, structured.SCHEMA)[0]
    n = max(spent["n"], 1)
    print(f"B=16 masks {name}: free {free:,.0f} tok/s, json_schema {guided:,.0f} tok/s "
          f"({100 * (1 - guided / free):+.1f} %); per step: masks {spent['masks'] / n * 1e3:.3f} ms, "
          f"postprocess {spent['post'] / n * 1e3:.3f} ms")
model.close()
