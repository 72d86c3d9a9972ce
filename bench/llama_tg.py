"""llama.cpp tg{n} on a file: a 16-token prompt, then n single-token decode steps, r repeats (2 threads).

Run with the llama-cpp-python venv (never a minfer dependency): /work/llama-venv/bin/python bench/llama_tg.py FILE 32 2
Alone, not beside minfer: both engines hold ~12 GB of a gpt-oss-20b file and this machine has 23 GB.
"""
import json
import resource
import sys
import time

import llama_cpp.llama_cpp as C
from llama_cpp import Llama

_d = C.llama_model_default_params


def _plain():
    p = _d()
    p.use_extra_bufts = False
    return p


C.llama_model_default_params = _plain  # AMX buffer types crash in this sandbox (bench/cpu_vs_llama.py)
path, n, reps = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
t0 = time.perf_counter()
llm = Llama(model_path=path, n_ctx=256, n_threads=2, n_threads_batch=2, n_batch=256, verbose=False, flash_attn=False)
load = time.perf_counter() - t0
res = []
for r in range(reps + 1):  # the first run warms the page cache
    llm.reset()
    llm.eval([10 + i for i in range(16)])
    t0 = time.perf_counter()
    for i in range(n):
        llm.eval([100 + i])
    dt = time.perf_counter() - t0
    if r:
        res.append(n / dt)
print(json.dumps({"load_s": round(load, 1), "tg": [round(x, 3) for x in res],
                  "peak_rss_gb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20, 2)}))
