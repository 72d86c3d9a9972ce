"""Tensor parallelism on this machine: N cpu processes over gloo give what 1 process gives.

Each run is a fresh process group (tp_scenario.py in a subprocess: it becomes rank 0 and starts
the other ranks itself, as `minfer ... --tp N` does). Compared with 1 process: logits of
prompts, of batched decode steps and of a mixed step within 1e-4 relative, and the same greedy
and seeded tokens. The CLI is checked the same way, self-started and under torchrun.

Models: tiny-llama f16 (tied output; 4 heads, 2 KV heads: at --tp 4 each KV head is on two
ranks) and tiny-qwen2 q4_0 with a 511-token vocabulary (biases, untied output, a vocabulary
the ranks split unevenly). On the cpu backend Q4_0 rows take a quantized kernel that rounds each
matmul's input (int8 per group of 32 on the VNNI kernel, bfloat16 on torch's int4 kernel); split,
each rank quantizes its own slice of the input, so those logits agree to that rounding, not to 1e-4.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from minfer.parallel.launch import free_port

SCENARIO = Path(__file__).with_name("tp_scenario.py")
TIMEOUT = 120


def _rel(x: torch.Tensor, ref: torch.Tensor) -> float:
    return ((x - ref).norm() / ref.norm()).item()


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    from minfer.gguf.synth import synth

    root = tmp_path_factory.mktemp("tp")
    return {"llama-f16": synth("tiny-llama", "f16", root / "llama-f16.gguf", progress=False),
            "qwen2-q4_0": synth("tiny-qwen2", "q4_0", root / "qwen2-q4_0.gguf", progress=False, vocab=511)}


@pytest.fixture(scope="module")
def scenario(models, tmp_path_factory):
    root = tmp_path_factory.mktemp("runs")
    done: dict[tuple[str, int], dict] = {}

    def run(model: str, tp: int) -> dict:
        if (model, tp) not in done:
            out = root / f"{model}-{tp}.pt"
            p = subprocess.run([sys.executable, str(SCENARIO), str(models[model]), str(tp), str(out)],
                               capture_output=True, text=True, timeout=TIMEOUT)
            assert p.returncode == 0, p.stderr[-3000:]
            done[model, tp] = torch.load(out)
        return done[model, tp]

    return run


@pytest.mark.parametrize("model, tp", [("llama-f16", 2), ("llama-f16", 4), ("qwen2-q4_0", 2)])
def test_split_ranks_give_the_logits_and_tokens_of_one_process(scenario, model, tp):
    one, split = scenario(model, 1), scenario(model, tp)
    assert one["tp_world"] == 1 and split["tp_world"] == tp
    for key in ("prefill_a", "prefill_b", "decode", "mixed", "prefix_logits"):
        assert _rel(split[key], one[key]) < (1e-4 if model == "llama-f16" else 2e-2), key
    assert split["greedy"] == one["greedy"]
    assert split["prefix"] == one["prefix"] and one["prefix"][1] == [32, 32]  # (one kept in its slot, one copied)
    # a reused block, then the prompt's rest in a smaller chunk than a fresh run's: its logits agree to rounding
    assert _rel(one["prefix_logits"], one["prefix_fresh"]) < 1e-5
    if model == "llama-f16":  # sampled from logits equal to 1e-7: the same draws
        assert split["sampled"] == one["sampled"]


def _minfer(args: list[str], env: dict | None = None, module: list[str] | None = None) -> subprocess.CompletedProcess:
    cmd = [sys.executable, *(module or ["-m", "minfer"]), *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=TIMEOUT, env=env)


def test_cli_tp_and_torchrun_print_what_one_process_prints(models):
    run = ["run", "-m", str(models["llama-f16"]), "-n", "12", "--temp", "0", "-c", "64", "the cat"]
    one = _minfer(run)
    assert one.returncode == 0, one.stderr
    two = _minfer(run + ["--tp", "2"])
    assert two.returncode == 0, two.stderr
    assert two.stdout == one.stdout and one.stdout.strip()
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    tr = _minfer(run, env=env, module=["-m", "torch.distributed.run", "--nproc-per-node", "2",
                                       "--master-port", str(free_port()), "-m", "minfer"])
    assert tr.returncode == 0, tr.stderr[-3000:]
    assert tr.stdout == one.stdout  # rank 1 printed nothing: only rank 0 runs the command


def test_a_split_that_cannot_be_made_fails_before_any_rank_starts(models):
    p = _minfer(["run", "-m", str(models["llama-f16"]), "-n", "4", "--tp", "3", "hi"])
    assert p.returncode != 0
    assert "--tp 3 does not divide the model's 4 attention heads" in p.stderr
    assert "rank 1" not in p.stderr  # refused on rank 0 before it started the others


@pytest.mark.slow
def test_the_cuda_backend_split_under_the_triton_interpreter(models, tmp_path):
    """cuda.py's code path with a tensor-parallel graph (its kernels picked for a rank's shapes,
    the vocab-parallel GetRows, AddRMSNorm after an AllReduce, decode_pick chained on the
    device), on host tensors over gloo. Not run here: CUDA graphs and NCCL (no GPU)."""
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    runs = {}
    for tp in (1, 2):
        out = tmp_path / f"cuda-{tp}.pt"
        p = subprocess.run([sys.executable, str(SCENARIO.with_name("tp_cuda_scenario.py")), str(models["llama-f16"]),
                            str(tp), str(out)], capture_output=True, text=True, timeout=300, env=env)
        assert p.returncode == 0, p.stderr[-3000:]
        runs[tp] = torch.load(out)
    one, two = runs[1], runs[2]
    assert two["tp_world"] == 2
    # the cuda kernels round q and p to f16 (the attention contracts' 5e-3): a split's ~1e-7 matmul
    # differences can flip an f16 rounding, so the split agrees to ~1e-4, not to float32's last bits
    for key in ("prefill", "decode"):
        assert _rel(two[key], one[key]) < 1e-3, key
    assert two["picked"] == one["picked"] and two["greedy"] == one["greedy"] and two["sampled"] == one["sampled"]


def test_communicator_collectives_and_a_follower_that_waits_longer_than_the_data_timeout():
    port = str(free_port())
    procs = [subprocess.Popen([sys.executable, str(SCENARIO.with_name("comm_pair.py")), str(r), port],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for r in (0, 1)]
    outs = [p.communicate(timeout=TIMEOUT) for p in procs]
    for p, (_, err) in zip(procs, outs, strict=True):
        assert p.returncode == 0, err[-3000:]
    gathered = [[0.0, 1.0, 2.0, 10.0, 11.0], [3.0, 4.0, 5.0, 13.0, 14.0]]  # rank 1 holds 2 of the 5 columns
    for rank, (out, _) in enumerate(outs):
        assert out.strip() == f"{rank} ('forward', [1, 2, 3]) {gathered} torch.float32 [3.0, 3.0, 3.0, 3.0] 4"


def _processes_with(text: str) -> list[int]:
    """Pids whose command line mentions `text` (Linux /proc)."""
    pids = []
    for d in Path("/proc").iterdir():
        try:
            if d.name.isdigit() and text in (d / "cmdline").read_bytes().decode(errors="replace"):
                pids.append(int(d.name))
        except OSError:
            pass
    return pids


def test_serve_tp2_answers_as_one_process_and_its_ranks_leave_with_it(models, tmp_path):
    import re
    import time

    import httpx

    import minfer

    path = models["llama-f16"]
    body = {"prompt": "the cat", "max_tokens": 10, "temperature": 0}
    with minfer.load(path, n_ctx=64, progress=False) as m:
        want = m.generate("the cat", max_tokens=10, temperature=0)
    log = tmp_path / "serve.log"
    with log.open("w") as f:
        proc = subprocess.Popen([sys.executable, "-m", "minfer", "serve", "-m", str(path), "--tp", "2", "--port", "0",
                                 "-c", "64", "-np", "2"], stdout=f, stderr=subprocess.STDOUT)
    try:
        deadline, url = time.monotonic() + TIMEOUT, None
        while time.monotonic() < deadline:
            assert proc.poll() is None, log.read_text()
            found = re.search(r"on (http://127\.0\.0\.1:\d+)", log.read_text())
            if found:
                url = found.group(1)
                try:
                    if httpx.get(url + "/health", timeout=5).json().get("status") == "ok":
                        break
                except httpx.HTTPError:
                    pass
            time.sleep(0.2)
        else:
            pytest.fail(f"not ready:\n{log.read_text()}")
        assert len(_processes_with("minfer.engine.tp")) >= 1  # rank 1 runs beside the server
        r = httpx.post(url + "/v1/completions", json=body, timeout=60)
        assert r.status_code == 200, r.text
        assert r.json()["choices"][0]["text"] == want
    finally:
        proc.terminate()
        proc.wait(30)
    deadline = time.monotonic() + 30
    while [p for p in _processes_with(str(path)) if p != proc.pid] and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not [p for p in _processes_with(str(path)) if p != proc.pid], "a rank outlived the server"


def test_a_cache_no_rank_can_hold_fails_every_rank_without_a_hang(models):
    code = ("import minfer, sys\n"
            "try:\n"
            f"    minfer.load({str(models['llama-f16'])!r}, tp=2, n_ctx=1 << 20, n_slots=64, progress=False)\n"
            "except minfer.errors.MinferError as e:\n"
            "    print('refused:', e); sys.exit(3)\n")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=TIMEOUT)
    assert p.returncode == 3, p.stderr[-3000:]
    assert "refused: a KV cache of 64 x 1048576 tokens needs" in p.stdout
    assert not [q for q in _processes_with(str(models["llama-f16"])) if q != os.getpid()], "a rank is left"
