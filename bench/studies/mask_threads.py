"""Where a B=16 grammar step's host time goes on the GPU machine (issue 28: structured outputs <= 10 %
of decode tok/s): the CPUs this process may use; `Masks.rows` for 16 rows of bench/structured.py's
schema with llguidance's default slices and with minfer's (engine/grammar.py: a ladder of short
string bounds as well), each matcher on a random walk through the grammar (each step's parser
state new to it, as a synthetic model's output gives; the walks made once with other matchers);
then the structured bench at B=16, the host's parts of a step timed. (Stop 43 measured the masks
split over 2-8 threads here too: no faster than one, on the H200's host nor on the 2-core EPYC.)

    PYTHONPATH=.:/tmp/pylib python3 bench/studies/mask_threads.py MODEL.gguf [DEVICE]
"""
import os
import random
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
from minfer.engine.grammar import Grammar, Matcher, ll_tokenizer  # noqa: E402

path, device = sys.argv[1], (sys.argv[2] if len(sys.argv) > 2 else "cuda")
cpu_max = Path("/sys/fs/cgroup/cpu.max")
print(f"os.cpu_count {os.cpu_count()}, affinity {len(os.sched_getaffinity(0))}, "
      f"cgroup cpu.max {cpu_max.read_text().strip() if cpu_max.exists() else 'n/a'}")
model = load(path, device, n_slots=16, n_ctx=320, progress=False)
tok, V = model.tokenizer, model.engine.n_vocab
rng = random.Random(0)
lanes = torch.arange(32)
W = (V + 31) // 32
STEPS = 80
compiled = Grammar.json_schema(structured.SCHEMA).compiled()
bits = torch.empty(16, W, dtype=torch.int32)
scratch = [Matcher(Grammar.json_schema(structured.SCHEMA), tok, V) for _ in range(16)]
paths = [[] for _ in range(16)]  # each row's random walk through the grammar, made with scratch matchers
for _ in range(STEPS):
    for i, m in enumerate(scratch):
        m.inner.unsafe_compute_mask_ptr(bits.data_ptr() + i * W * 4, W * 4)
        allowed = ((bits[i].unsqueeze(1) >> lanes) & 1).flatten()[:V].nonzero().flatten()
        paths[i].append(int(allowed[rng.randrange(len(allowed))]))
        assert m.consume(paths[i][-1])
ours = ll_tokenizer(tok, V)
for slices, lt in (("llguidance's", ours.with_slices(llguidance.LLTokenizer.general_slices())), ("minfer's", ours)):
    ms = [Matcher.__new__(Matcher) for _ in range(16)]
    for m in ms:  # fresh matchers on the same walks: every step's state is new to them
        m.inner = llguidance.LLMatcher(lt, compiled, log_level=0)
    masks = masks_mod.Masks(pinned=device == "cuda")
    times = []
    for k in range(STEPS):
        t = time.perf_counter()
        masks.rows(ms, V)
        times.append(time.perf_counter() - t)
        for i, m in enumerate(ms):
            assert m.inner.consume_token(paths[i][k])
    masks.close()
    times.sort()
    print(f"Masks.rows, 16 fresh rows, {slices} slices: mean {sum(times) / len(times) * 1e3:.2f} ms, "
          f"p50 {times[len(times) // 2] * 1e3:.2f}, p90 {times[int(len(times) * 0.9)] * 1e3:.2f}", flush=True)

# the engine's step at B=16, with the host's parts timed
real_rows = masks_mod.Masks.rows
spent = {"masks": 0.0, "post": 0.0, "n": 0}
sched = model.engine.scheduler
real_post = sched.postprocess


def timed_post(*a, **k):
    t = time.perf_counter()
    out = real_post(*a, **k)
    spent["post"] += time.perf_counter() - t
    spent["n"] += 1
    return out


def timed_rows(self, matchers, n_vocab):
    t = time.perf_counter()
    out = real_rows(self, matchers, n_vocab)
    spent["masks"] += time.perf_counter() - t
    return out


sched.postprocess = timed_post
masks_mod.Masks.rows = timed_rows
structured.decode_rate(model, 16, 32, structured.SCHEMA)
free = structured.decode_rate(model, 16, 256, None)[0]
spent.update(masks=0.0, post=0.0, n=0)
guided = structured.decode_rate(model, 16, 256, structured.SCHEMA)[0]
n = max(spent["n"], 1)
print(f"B=16: free {free:,.0f} tok/s, json_schema {guided:,.0f} tok/s "
      f"({100 * (1 - guided / free):+.1f} %); per step: masks {spent['masks'] / n * 1e3:.3f} ms, "
      f"postprocess {spent['post'] / n * 1e3:.3f} ms", flush=True)
model.close()
