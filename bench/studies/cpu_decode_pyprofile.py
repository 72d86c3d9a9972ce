"""What a cpu decode token costs outside the C decode program (issue 26: 0.6-0.8 ms a token for
Qwen2.5-0.5B's 151,936-token vocabulary on the H200's host, 0.3-0.4 for SmolLM2's 49,152): cProfile of
64 greedy tokens, the functions by their own time, prog_run's call shown as DecodeProgram.run's;
then the greedy pick of one row of the model's logits width: torch.argmax against the C kernel
(cpu_argmax_rows, the backend's).

    python3 bench/studies/cpu_decode_pyprofile.py MODEL.gguf [THREADS]
"""
import cProfile
import pstats
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch  # noqa: E402

from minfer.api import load, sampling_params  # noqa: E402
from minfer.kernels.cpu import vnni  # noqa: E402

model = load(sys.argv[1], "cpu", n_slots=1, n_ctx=256, threads=int(sys.argv[2]) if len(sys.argv) > 2 else None,
             progress=False)
params = sampling_params(temperature=0, max_tokens=64, ignore_eos=True)
model.generate("Once upon a time", params=params)  # warm-up
prof = cProfile.Profile()
prof.enable()
model.generate("Once upon a time", params=params)
prof.disable()
pstats.Stats(prof).sort_stats("tottime").print_stats(25)

row = torch.randn(1, model.engine.n_vocab)
for name, fn in (("torch.argmax", lambda: row.argmax(-1).tolist()), ("cpu_argmax_rows", lambda: vnni.argmax_rows(row))):
    fn()
    t = time.perf_counter()
    for _ in range(200):
        fn()
    print(f"{name} of {row.shape[1]} logits: {(time.perf_counter() - t) / 200 * 1e6:.1f} us")
