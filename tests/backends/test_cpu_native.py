"""The cpu backend's decode program (backends/cpu/native.py: a decode step as one C call) against the
per-node path it replaces: the same logits and the same KV cache, bit for bit, on the real SmolLM2 and on
synthetic qwen2 (biases) and Q4_K_M (stacked parts of two types) models, for one and several rows at
mixed positions, at one and two threads; graphs it cannot run keep the per-node path."""

from __future__ import annotations

import pytest
import torch

from minfer.api import load
from minfer.backends.base import Batch
from minfer.backends.cpu import native as prog
from minfer.kernels.cpu import vnni as cpu_vnni

pytestmark = pytest.mark.skipif(not cpu_vnni.available(), reason="needs the C kernels (AVX2 or AVX512-VNNI)")

PROMPTS = ([1, 504, 3458, 282, 4649, 314, 1345, 30], [1, 9, 12, 55, 7], [2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13])


def _prefill(be, slots_prompts):
    for slot, toks in slots_prompts:
        be.forward(Batch.build([(slot, 0, list(toks))], [len(toks) - 1]))


def _decode(be, rows: list[tuple[int, int, int]], native: bool) -> torch.Tensor:
    """One decode step of rows (slot, position, token), through the program or the per-node path."""
    keep = be.native_reason
    if not native:
        be.native_reason = "off for the comparison"
    try:
        return be.forward(Batch.build([(s, p, [t]) for s, p, t in rows], list(range(len(rows))),
                                      n_decode=len(rows)))
    finally:
        be.native_reason = keep


def _both_ways(path, steps: int = 4, n_prompts: int = 3, vocab: int | None = None, prompts=PROMPTS, n_ctx: int = 64):
    """Prompts in slots 0.. (per-node) and again in slots n.. (program), then `steps` decode steps of every
    row together; asserts equal logits and caches each step. Returns how many rows the program was made for."""
    with load(path, "cpu", n_ctx=n_ctx, n_slots=2 * n_prompts, progress=False, cpu_native=True) as m:
        be = m.engine.backend
        assert be.native_reason is None, be.native_reason
        prompts = [[t % (vocab or 10**9) for t in p] for p in prompts[:n_prompts]]
        _prefill(be, [(i, p) for i, p in enumerate(prompts)] + [(n_prompts + i, p) for i, p in enumerate(prompts)])
        toks = [p[-1] for p in prompts]
        for step in range(steps):
            pos = [len(p) + step for p in prompts]
            ref = _decode(be, [(i, pos[i], toks[i]) for i in range(n_prompts)], native=False)
            got = _decode(be, [(n_prompts + i, pos[i], toks[i]) for i in range(n_prompts)], native=True)
            assert torch.equal(got, ref), f"step {step}: max |d| {(got - ref).abs().max().item()}"
            for i in range(n_prompts):  # the rows' keys and values, every layer, written where they belong
                assert torch.equal(be.cache.k[:, n_prompts + i, :, :pos[i] + 1], be.cache.k[:, i, :, :pos[i] + 1])
                assert torch.equal(be.cache.v[:, n_prompts + i, :, :pos[i] + 1], be.cache.v[:, i, :, :pos[i] + 1])
            toks = ref.argmax(-1).tolist()
        return be._program.rows


def test_program_equals_the_per_node_path_on_smollm2(smollm2_path):
    assert _both_ways(smollm2_path, steps=3) == 4  # (3 rows: a program of 4 rows runs them)


def test_program_equals_the_per_node_path_past_one_attention_chunk(smollm2_path):
    """Rows past CHUNK keys: attention's tasks are merged in a second loop, which quantizes each merged head for
    the output projection (the int8 pass folded into the attention step); rows of one chunk each skip the merge
    and quantize in their tasks. Rows of both kinds together, then each kind alone."""
    long = [(7 * i + 3) % 4000 + 1 for i in range(cpu_vnni.ATTN_CHUNK + 21)]
    longer = [(11 * i + 5) % 4000 + 1 for i in range(2 * cpu_vnni.ATTN_CHUNK + 40)]
    assert _both_ways(smollm2_path, steps=2, prompts=(long, PROMPTS[0], longer), n_ctx=512) == 4
    assert _both_ways(smollm2_path, steps=2, n_prompts=2, prompts=(long, longer), n_ctx=512) == 2


def test_the_program_folds_its_light_steps_into_their_producers(smollm2_path):
    """SmolLM2's layer is 8 steps: the norm row, q+k+v, RoPE with the KV write, attention with its output's
    int8 pass, o, the add + norm row, gate+up with its SwiGLU and that one's int8 pass, down (11 before the
    folds of the KV write, attention's int8 pass and the GLU)."""
    with load(smollm2_path, "cpu", n_ctx=64, n_slots=1, progress=False, cpu_native=True) as m:
        be = m.engine.backend
        _prefill(be, [(0, PROMPTS[0])])
        _decode(be, [(0, len(PROMPTS[0]), 30)], native=True)
        steps, n_layer = be._program._steps, be.graph.meta["n_layer"]
        ops = [s["op"] for s in steps]
        assert not {prog.PS_KV, prog.PS_QUANT, prog.PS_GLU, prog.PS_GLU_Q} & set(ops), ops
        assert sum(s["op"] == prog.PS_ROPE and s["kv_n"] == 3 for s in steps) == n_layer
        assert sum(s["op"] == prog.PS_ATTN and s["q8"] is not None and s["qp"] == 2 for s in steps) == n_layer
        glu = [s for s in steps if s["op"] == prog.PS_GEMM and s.get("g_out")]
        assert len(glu) == n_layer and all(s["n"] == 3072 and s["q8"] is not None for s in glu)
        assert len(steps) == 8 * n_layer + 3  # (+ the output norm row, the vocabulary's GEMM and the greedy pick)


@pytest.mark.parametrize("preset,quant", [("tiny-qwen2", "q4_0"), ("tiny-llama", "q4_k_m"), ("tiny-llama", "q8_0"),
                                          ("tiny-qwen3", "q4_0"), ("tiny-gemma3", "q4_0"), ("tiny-phi3", "q4_0")])
def test_program_equals_the_per_node_path_on_synthetic_models(tiny_gguf, preset, quant):
    """qwen2's q/k/v biases (added in the GEMM's store), Q4_K_M's Q4_K q/k stacked with a Q6_K v (two GEMM
    steps into one buffer), Q8_0 (8-bit codes), qwen3's per-head q / k RMSNorms and YaRN RoPE tables, gemma3's
    embedding scale, GeGLU and sliding windows (tiny-gemma3's window is 8: the later steps are past it), phi3's
    one-tensor q+k+v and gate+up and LongRoPE tables."""
    assert _both_ways(tiny_gguf(preset, quant), steps=3, vocab=200) == 4


def test_program_rows_do_not_depend_on_the_batch_or_the_threads(smollm2_path):
    """Batch invariance: each row decoded with two others equals it decoded alone (by the same program of 4
    rows, made for the three: it runs any row count up to its own); one thread equals two."""
    with load(smollm2_path, "cpu", n_ctx=64, n_slots=4, progress=False, cpu_native=True) as m:
        be = m.engine.backend
        _prefill(be, list(enumerate(PROMPTS)))
        rows = [(i, len(p), p[-1]) for i, p in enumerate(PROMPTS)]
        together = _decode(be, rows, native=True)
        threads = torch.get_num_threads()
        try:
            for i, row in enumerate(rows):
                torch.set_num_threads(1 if i % 2 else max(2, threads))
                alone = _decode(be, [row], native=True)
                assert torch.equal(alone[0], together[i]), f"row {i}: {(alone[0] - together[i]).abs().max().item()}"
        finally:
            torch.set_num_threads(threads)


def test_the_program_follows_the_cache_when_it_is_reallocated(smollm2_path):
    """A program's steps hold the cache's addresses: allocate() drops them, the next step makes a new one."""
    with load(smollm2_path, "cpu", n_ctx=64, n_slots=2, progress=False, cpu_native=True) as m:
        be = m.engine.backend
        _prefill(be, [(0, PROMPTS[0])])
        first = _decode(be, [(0, len(PROMPTS[0]), 30)], native=True)
        be.allocate(2, 128)
        assert be._program is None
        _prefill(be, [(1, PROMPTS[0])])
        again = _decode(be, [(1, len(PROMPTS[0]), 30)], native=True)
        assert torch.equal(first, again)


def test_graphs_it_cannot_run_keep_the_per_node_path(tiny_gguf, monkeypatch):
    """gemma2 (its logits' SoftCap): the reason names a node, and decode still runs (per node)."""
    with load(tiny_gguf("tiny-gemma2", "q4_0"), "cpu", n_ctx=64, n_slots=1, progress=False, cpu_native=True) as m:
        be = m.engine.backend
        assert be.native_reason is not None
        assert be.native_reason.split(":")[0] in {n.name for n in be.graph.nodes}, be.native_reason
        _prefill(be, [(0, [1, 2, 3])])
        assert torch.isfinite(_decode(be, [(0, 3, 4)], native=True)).all()
        assert be._program is None
    monkeypatch.setenv("MINFER_CPU_NATIVE", "0")  # (on by default: the switch turns it off)
    with load(tiny_gguf("tiny-llama", "q4_0"), "cpu", n_ctx=64, n_slots=1, progress=False) as m:
        assert "MINFER_CPU_NATIVE=0" in m.engine.backend.native_reason
    monkeypatch.delenv("MINFER_CPU_NATIVE", raising=False)
    with load(tiny_gguf("tiny-llama", "q4_0"), "cpu", n_ctx=64, n_slots=1, progress=False) as m:
        assert m.engine.backend.native_reason is None


def test_the_switch_changes_no_number(smollm2_path):
    """MINFER_CPU_NATIVE=0 (EngineConfig.cpu_native=False) runs the same kernels node by node: the same
    greedy text and logits as the default, prompt and decode (the GLU was torch's there once, and the
    README's question then took another token at a near-tie)."""
    outs = []
    for native in (True, False):
        with load(smollm2_path, "cpu", n_ctx=128, n_slots=1, progress=False, cpu_native=native) as m:
            assert (m.engine.backend.native_reason is None) == native
            text = m.generate("The capital of France is", max_tokens=24, temperature=0.0)
            outs.append((text, m.logits(m.tokenize("The capital of France is" + text))))
    assert outs[0][0] == outs[1][0]
    assert torch.equal(outs[0][1], outs[1][1])


def test_threads_off_their_cores_change_no_number(smollm2_path):
    """The program's steps hand out their items from counters and end when the items are done (q4_vnni.c
    TEAM_FOR), so a thread the kernel keeps off its core is not waited for. With three times as many threads
    as cores and two busy processes beside them (threads join late, skip steps whose items are taken, stop
    mid-step), eight steps of three rows give the one-thread program's logits and caches, bit for bit."""
    import os
    import subprocess
    import sys

    def run(threads: int) -> tuple[list[torch.Tensor], torch.Tensor, torch.Tensor]:
        with load(smollm2_path, "cpu", n_ctx=64, n_slots=3, progress=False, cpu_native=True) as m:
            be = m.engine.backend
            keep = torch.get_num_threads()
            torch.set_num_threads(threads)
            try:
                _prefill(be, list(enumerate(PROMPTS)))
                toks, out = [p[-1] for p in PROMPTS], []
                for step in range(8):
                    logits = _decode(be, [(i, len(p) + step, toks[i]) for i, p in enumerate(PROMPTS)], native=True)
                    out.append(logits)
                    toks = logits.argmax(-1).tolist()
                return out, be.cache.k.clone(), be.cache.v.clone()
            finally:
                torch.set_num_threads(keep)

    want = run(1)
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(2)]
    try:
        got = run(3 * cores)
    finally:
        for h in hogs:
            h.kill()
            h.wait()
    for step, (a, b) in enumerate(zip(got[0], want[0], strict=True)):
        assert torch.equal(a, b), f"step {step}: max |d| {(a - b).abs().max().item()}"
    assert torch.equal(got[1], want[1]) and torch.equal(got[2], want[2])


def test_the_program_pick_is_torch_argmax():
    """The program's greedy pick (PS_PICK: each part of PICK_COLS columns its first maximum, then the parts in column
    order) against torch.argmax on crafted rows: the maximum in a later part, a tie across parts (the first wins), a
    NaN after a larger number (the first NaN wins), two NaNs, every value -inf, a maximum in the short last part;
    at one and three threads."""
    n = 3 * prog.PICK_COLS + 17
    parts = -(-n // prog.PICK_COLS)
    x = torch.randn(6, n, generator=torch.Generator().manual_seed(3))
    x[0, 2 * prog.PICK_COLS + 5] = 9.0
    x[1, 7] = x[1, prog.PICK_COLS + 3] = x[1, 3 * prog.PICK_COLS + 1] = 8.0
    x[2, 10] = 50.0
    x[2, prog.PICK_COLS + 9] = float("nan")
    x[3, 2 * prog.PICK_COLS] = x[3, 20] = float("nan")
    x[4] = float("-inf")
    x[5, n - 1] = 7.0
    want = x.argmax(-1).tolist()
    assert want == [2 * prog.PICK_COLS + 5, 7, prog.PICK_COLS + 9, 20, 0, n - 1]
    out = torch.full((6,), -1, dtype=torch.int32)
    pv, pi = torch.zeros(6 * parts), torch.zeros(6 * parts, dtype=torch.int32)
    step = prog._Step(op=prog.PS_PICK, n=n, ldx=n, a0=parts, x=x.data_ptr(), y=out.data_ptr(), z=pv.data_ptr(),
                      w=pi.data_ptr())
    steps = (prog._Step * 1)(step)
    zeros = torch.zeros(6, dtype=torch.int32)
    lens = torch.ones(6, dtype=torch.int32)
    for threads in (1, 3):
        torch.set_num_threads(threads)
        out.fill_(-1)
        assert cpu_vnni._library().prog_run(steps, 1, 6, zeros.data_ptr(), zeros.data_ptr(), lens.data_ptr(), 1, 8,
                                            1) == 0
        assert out.tolist() == want, threads


def test_decode_pick_gives_the_forward_logits_argmax(smollm2_path):
    """The backend's decode_pick (the program with its pick) picks what the argmax of forward's logits picks, for
    one and three rows, and the engine's greedy text is the same with the pick and without it (per-node path)."""
    with load(smollm2_path, "cpu", n_ctx=64, n_slots=3, progress=False, cpu_native=True) as m:
        be = m.engine.backend
        _prefill(be, [(i, p) for i, p in enumerate(PROMPTS)])
        for rows in ([(0, len(PROMPTS[0]), 42)], [(i, len(p), p[-1]) for i, p in enumerate(PROMPTS)]):
            batch = Batch.build([(s, p, [t]) for s, p, t in rows], list(range(len(rows))), n_decode=len(rows))
            picked = be.decode_pick(batch).tokens()
            assert picked == be.forward(batch).argmax(-1).tolist()
        params = dict(max_tokens=24, temperature=0)
        with_pick = m.generate("The capital of France is", **params)
        be.native_reason = "off: the per-node path and the host's pick"
        assert m.generate("The capital of France is", **params) == with_pick
