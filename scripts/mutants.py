#!/usr/bin/env python3
"""Planted bugs (issue 30 item 4): does the test suite catch the bugs its tests name?

Each mutant is one known bug written into the code (an exact text replaced by another, found once in
its file). For each, on a copy of the working tree (tracked and untracked files, nothing ignored), the
script writes the bug, runs the tests meant to catch it, puts the file back, and reports

    caught   a test failed (pytest exit 1; the first failing test is named)
    MISSED   every test passed: the suite lets this bug through
    stale    the text is not found exactly once: the code moved; the mutant must follow it
    error    the run could not test it (collection error, no test selected, a timeout)

and exits 0 only when every mutant it ran was caught. `--device cpu` (the default; CI, this machine)
runs the mutants of the cpu backend, the Triton kernels under the interpreter (the cuda backend runs
there on CPU tensors) and the vulkan backend on lavapipe; `--device cuda` runs the same interpreter
mutants with MINFER_TEST_DEVICE=cuda (compiled kernels, real CUDA graphs) and the GPU-only checks
(the conformance harness's `--full` GEMV cases above 2^24 weights).

    python scripts/mutants.py                      # every cpu mutant, a table at the end
    python scripts/mutants.py --device cuda        # on the GPU machine
    python scripts/mutants.py --only gqa_off_by_one --keep
    python scripts/mutants.py --list               # what each plants and which tests should catch it
    python scripts/mutants.py --no-baseline        # skip the unmutated runs (only when they are known to pass)

Before the mutants, each distinct set of tests runs once on the unmutated copy and must pass: a test that
fails anyway would count as a catch (a mutant whose tests fail unmutated is an error, not caught).

The mutants target the tree after the core refactor (issue 22): backends/{cpu,cuda,vulkan}/,
backends/bindings.py, kernels/{triton,wgsl,cpu}/.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class Mutant:
    name: str
    bug: str  # what the planted bug is (and where it was once found)
    path: str  # the file, relative to the repository root
    old: str  # exact text, found once in the file
    new: str
    tests: tuple[str, ...]  # pytest node ids / paths that should catch it (-x: the first failure ends the run)
    devices: tuple[str, ...] = ("cpu", "cuda")  # where it runs (cuda: MINFER_TEST_DEVICE=cuda)
    command: tuple[str, ...] = field(default=())  # a command instead of pytest (caught: a non-zero exit)


CUDA = "tests/backends/test_cuda_backend.py"
WGPU = "tests/backends/test_wgpu_backend.py"
NATIVE = "tests/backends/test_cpu_native.py"  # the decode program against the per-node path, bit for bit
ORACLE = "tests/models/test_smollm2_oracle.py"
CONFORMANCE = "tests/contracts/test_conformance.py::test_kernel_conforms_to_its_contract"

MUTANTS: tuple[Mutant, ...] = (
    # ---- the six bugs of the audit (2026-12-02) that the end-to-end tests let through
    Mutant(
        "rope_decode_row_ahead",
        "a decode row's RoPE one position ahead (the q+k+v GEMV's epilogue; once backends/calls.py compile_rope)",
        "minfer/backends/bindings.py",
        "y = kernel(x=vals[x], w=laid, b=b, positions=vals[pos], cos=cos, sin=sin, **params, **more)",
        "y = kernel(x=vals[x], w=laid, b=b, positions=vals[pos] + 1, cos=cos, sin=sin, **params, **more)",
        (f"{CUDA}::test_prompt_and_decode_logits_match_cpu",),
    ),
    Mutant(
        "vulkan_attention_scale",
        "the vulkan attention's scale x1.05 (once passed the SmolLM2 logits and greedy tests)",
        "minfer/kernels/wgsl/attention.py",
        '    what = "vk attention"\n',
        '    what = "vk attention"\n    scale = scale * 1.05\n',
        (f"{WGPU}::test_smollm2_prompt_logits_match_cpu",
         f"{WGPU}::test_smollm2_greedy_tokens_equal_cpu_where_decisive",
         f"{WGPU}::test_tiny_models_of_other_weight_types_match_cpu"),
        devices=("cpu",),
    ),
    Mutant(
        "greedy_picks_runner_up",
        "the cuda backend's greedy pick on the device returns the second most likely token (a greedy comparison "
        "with no decisive step cannot see it)",
        "minfer/backends/cuda/backend.py",
        "return self.argmax(x=logits) if params is None else",
        "return logits.topk(2, dim=-1).indices[:, 1].to(torch.int32) if params is None else",
        (f"{CUDA}::test_greedy_generation_matches_cpu_where_decisive",),
    ),
    Mutant(
        "logprobs_unnormalised",
        "logprobs returned as row - max (not normalised: the top token's is 0)",
        "minfer/engine/logprobs.py",
        "lp = torch.log_softmax(row.detach().float().cpu(), dim=-1)",
        "lp = row.detach().float().cpu()\n    lp = lp - lp.max()",
        ("tests/engine/test_logprobs.py", "tests/server/test_openai_api.py::test_logprobs"),
        devices=("cpu",),
    ),
    Mutant(
        "cpu_rmsnorm_kernel_per_batch",
        "the cpu RMSNorm takes another kernel for batches than for one row (results differ in the last bits)",
        "minfer/backends/cpu/ops.py",
        "if self.c and x.dtype == torch.float32 and x.dim() == 2:",
        "if self.c and x.dtype == torch.float32 and x.dim() == 2 and x.shape[0] == 1:",
        ("tests/models/test_batch.py", NATIVE),
        devices=("cpu",),
    ),
    Mutant(
        "gemv_one_int8_pass",
        "the Q4 GEMVs above 2^24 weights read x in one int8 pass instead of two (~5e-3 instead of ~2e-5)",
        "minfer/kernels/triton/gemv.py",
        "check_act_q8(act_q8) if n * k > Q8_MIN_WEIGHTS else 0",
        "min(check_act_q8(act_q8), 1) if n * k > Q8_MIN_WEIGHTS else 0",
        (f"{CUDA}::test_int8_activations_from_the_norms",),
    ),
    Mutant(
        "gemv_one_int8_pass_full",
        "as gemv_one_int8_pass, seen by the contracts' 1e-4 bound on the --full cases above 2^24 weights",
        "minfer/kernels/triton/gemv.py",
        "check_act_q8(act_q8) if n * k > Q8_MIN_WEIGHTS else 0",
        "min(check_act_q8(act_q8), 1) if n * k > Q8_MIN_WEIGHTS else 0",
        (),
        devices=("cuda",),
        command=(sys.executable, "-m", "minfer.contracts.conformance", "--device", "cuda", "--full",
                 "--kernel", "q4_0_gemv", "--kernel", "int4_gemv", "--kernel", "gemv_swiglu", "--kernel", "gemv_rope"),
    ),
    Mutant(
        "cpu_vnni_one_pass",
        "the cpu backend's VNNI matmuls read a decode row's activations in one int8 pass instead of two (its "
        "contract: 5e-3 declared against ~2e-5 measured; prompts take one pass by design)",
        "minfer/backends/cpu/weights.py",
        "return (2,) * len(self._runs) if decode else self.prefill_passes",
        "return (1,) * len(self._runs) if decode else self.prefill_passes",
        (ORACLE, "tests/models/test_engine_consistency.py"),
        devices=("cpu",),
    ),
    # ---- the further list
    Mutant(
        "kv_written_one_slot_off",
        "the cpu decode rows' keys and values written into the next slot (read from their own)",
        "minfer/backends/cpu/backend.py",
        "self.at = ((batch.row_slots.long() * (n_kv * n_ctx)",
        "self.at = ((((batch.row_slots.long() + 1) % cache.k.shape[1]) * (n_kv * n_ctx)",
        (ORACLE, "tests/models/test_engine_consistency.py", NATIVE),
        devices=("cpu",),
    ),
    Mutant(
        "kv_fused_write_one_slot_off",
        "the q+k+v GEMV epilogue writes a decode row's k, v into the next slot (the attention reads its own)",
        "minfer/backends/bindings.py",
        'more.update(cache_k=ck, cache_v=cv, row_slots=st.inputs["row_slots"], layer=li, n_head_kv=nkv)',
        'more.update(cache_k=ck, cache_v=cv, row_slots=(st.inputs["row_slots"] + 1) % ck.shape[1], layer=li, '
        'n_head_kv=nkv)',
        (f"{CUDA}::test_prompt_and_decode_logits_match_cpu",),
    ),
    Mutant(
        "swiglu_gate_up_swapped",
        "SwiGLU's gate and up swapped (silu(up) * gate) in the cpu reference op",
        "minfer/backends/cpu/ops.py",
        "return F.silu(gate).mul_(up)",
        "return F.silu(up).mul_(gate)",
        (ORACLE,),
        devices=("cpu",),
    ),
    Mutant(
        "glu_c_gate_up_swapped",
        "gate and up swapped at the C GLU kernel's call node by node (the decode program's path, MINFER_CPU_NATIVE=1)",
        "minfer/backends/cpu/steps.py",
        "return c_fn(g, u)",
        "return c_fn(u, g)",
        (NATIVE,),
        devices=("cpu",),
    ),
    Mutant(
        "mm16_block_reads_next_expert",
        "the grouped expert matmul on f16 tensor cores reads the next expert's rows for a block (moe_mm16)",
        "minfer/kernels/triton/moe.py",
        "cols = (tl.minimum(offs_n, N - 1).to(tl.int64) + expert.to(tl.int64) * N)[:, None, None]",
        "cols = (tl.minimum(offs_n, N - 1).to(tl.int64) + ((expert + 1) % NEXP).to(tl.int64) * N)[:, None, None]",
        ("tests/kernels/triton/test_moe.py",),
    ),
    Mutant(
        "moe_grouping_shared_across_layers",
        "a layer's grouping reused for another ids tensor (moe.py `aligned` keyed by sizes alone)",
        "minfer/kernels/triton/moe.py",
        "if hit is not None and hit[0]() is ids and hit[1] == key:",
        "if hit is not None and hit[1][1:3] == key[1:3]:",
        ("tests/kernels/triton/test_moe.py",),
        devices=("cpu",),
    ),
    Mutant(
        "gemv_rows_share_split_counters",
        "a small batch's rows counting their split-K arrivals on one set of counters (gemv.py ROWS mode "
        "without its per-row counter offset): a row's last program adds partial sums other rows have not written. "
        "GPU only: the interpreter runs a tile's split programs one after another, so the counts come out right",
        "minfer/kernels/triton/gemv.py",
        "        cnt_ptr += row * tl.cdiv(N, BLOCK_N)\n",
        "",
        ("tests/kernels/triton/test_qmatmul.py::test_gemv_small_batches",),
        devices=("cuda",),
    ),
    Mutant(
        "gemv_rows_read_row0",
        "every row of a small decode batch reading x's first row (gemv.py ROWS mode without its x row offset)",
        "minfer/kernels/triton/gemv.py",
        "        x_ptr += row.to(tl.int64) * (NKB * 32 if Q8X == 0 else NKB * (8 * Q8X))\n",
        "",
        ("tests/backends/test_cuda_backend.py::test_small_batches_run_the_gemv_row_programs",),
    ),
    Mutant(
        "native_rope_row_ahead",
        "the cpu decode program's RoPE one position ahead (q and k turned by the next position's angles)",
        "minfer/kernels/cpu/q4_vnni.c",
        "(const float *)p->w + (size_t)pos[t] * half, (const float *)p->s + (size_t)pos[t] * half,",
        "(const float *)p->w + (size_t)(pos[t] + 1) * half, (const float *)p->s + (size_t)(pos[t] + 1) * half,",
        (ORACLE, NATIVE),
        devices=("cpu",),
    ),
    Mutant(
        "gqa_off_by_one",
        "the prompt attention kernel maps query head h to kv head h // G + 1 (GQA mapping off by one)",
        "minfer/kernels/triton/attention.py",
        "base = layer_off + slot * S_STRIDE + (head // G).to(tl.int64) * H_STRIDE",
        "base = layer_off + slot * S_STRIDE + ((head // G + 1) % (N_HEAD // G)).to(tl.int64) * H_STRIDE",
        (f"{CONFORMANCE}[attention_prefill]", f"{CUDA}::test_prompt_and_decode_logits_match_cpu"),
    ),
    Mutant(
        "q8_0_scale_exponent",
        "a Q8_0 block's scale read one binary exponent off (x2) by the dequant kernel",
        "minfer/kernels/triton/dequant.py",
        "    return q.to(tl.float32) * _f16(p, 0, mask)\n",
        "    return q.to(tl.float32) * (_f16(p, 0, mask) * 2.0)\n",
        ("tests/kernels/triton/test_dequant.py::test_dequant_matches_reference", f"{CONFORMANCE}[dequant]"),
    ),
    Mutant(
        "q8_0_gemv_scale_exponent",
        "a Q8_0 block's scale one binary exponent off (x2) in the GEMV's planes layout",
        "minfer/kernels/triton/planes.py",
        "return q, b[:, 0:2].contiguous().view(torch.float16), None",
        "return q, b[:, 0:2].contiguous().view(torch.float16) * 2, None",
        ("tests/kernels/triton/test_qmatmul.py::test_planes_gemv", f"{CONFORMANCE}[q8_0_gemv]",
         f"{CUDA}::test_prompt_and_decode_logits_match_cpu"),
    ),
    Mutant(
        "stop_string_leaks_a_char",
        "a completed stop string leaks its first character into the text",
        "minfer/engine/sequence.py",
        "out, self.pending = self.pending[:min(hits)], \"\"",
        "out, self.pending = self.pending[:min(hits) + 1], \"\"",
        ("tests/engine/test_scheduler.py::test_stop_string_ends_and_never_leaks_partially",
         "tests/server/test_openai_api.py::test_stop_string_never_leaks"),
        devices=("cpu",),
    ),
    Mutant(
        "last_prompt_chunk_dropped",
        "a prompt in several chunks loses its last one (all but its final token, which still gives the logits)",
        "minfer/engine/scheduler.py",
        "        for pre, chunk in step.prefills:\n            pre.n_cached += chunk\n",
        "        for pre, chunk in step.prefills:\n            left = pre.n_prompt - pre.n_cached - chunk\n"
        "            pre.n_cached += chunk if left >= self.prefill_chunk else chunk + max(left - 1, 0)\n",
        ("tests/models/test_engine_consistency.py::test_a_prompt_in_many_chunks_equals_it_in_one",
         "tests/engine/test_scheduler.py::test_prompt_logits_are_kept_across_chunks"),
        devices=("cpu",),
    ),
    # ---- the deferred RMSNorm (stop 50): a reader that forgets the rms, a tile's sum of squares left out
    Mutant(
        "deferred_norm_rms_forgotten",
        "a GEMV reading a deferred RMSNorm's h * w stores its sums undivided by the rms (the split-K path's)",
        "minfer/kernels/triton/gemv.py",
        "            if RSTD > 0:\n                total = total * _rstd(rs_ptr, RS_N, RS_K, RS_EPS, RSTD)\n",
        "",
        ("tests/kernels/triton/test_gemv_fused.py::test_a_reader_with_rstd_gives_the_gemv_of_the_normed_row",),
    ),
    Mutant(
        "deferred_norm_tile_short",
        "the rms of a deferred RMSNorm from all but the last row tile's sum of squares",
        "minfer/kernels/triton/gemv.py",
        "tl.load(rs_ptr + i, mask=i < RS_N, other=0.0",
        "tl.load(rs_ptr + i, mask=i < RS_N - 1, other=0.0",
        (f"{CUDA}::test_a_deferred_rms_norm_runs_for_decode_rows",),
    ),
)


# ------------------------------------------------------------------------------------------ running
@dataclass
class Outcome:
    mutant: Mutant
    result: str  # caught / MISSED / stale / error
    detail: str = ""
    seconds: float = 0.0


def tree_files(src: Path) -> list[str]:
    """The working tree's files: tracked and untracked, nothing git ignores."""
    out = subprocess.run(["git", "-C", str(src), "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                         check=True, capture_output=True).stdout.decode()
    return [f for f in out.split("\0") if f and (src / f).is_file()]


def copy_tree(src: Path, dst: Path) -> None:
    for f in tree_files(src):
        target = dst / f
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src / f, target)


def run_env(tree: Path, device: str) -> dict[str, str]:
    env = dict(os.environ, PYTHONPATH=str(tree), PYTHONDONTWRITEBYTECODE="1")  # (no stale .pyc between mutants)
    env.pop("MINFER_TEST_DEVICE", None)
    if device == "cuda":
        env["MINFER_TEST_DEVICE"] = "cuda"
    return env


def argv_of(m: Mutant) -> list[str]:
    if m.command:
        return list(m.command)
    return [sys.executable, "-m", "pytest", *m.tests, "-x", "-q", "-p", "no:cacheprovider", "-rf",
            "--no-header"]


def run_tests(m: Mutant, tree: Path, device: str, timeout: float, log: Path) -> tuple[int | None, str]:
    """(exit code or None on a timeout, the output)."""
    try:
        p = subprocess.run(argv_of(m), cwd=tree, env=run_env(tree, device), capture_output=True, text=True,
                           timeout=timeout)
        text, rc = p.stdout + p.stderr, p.returncode
    except subprocess.TimeoutExpired as e:
        text, rc = (e.stdout or b"").decode(errors="replace") if isinstance(e.stdout, bytes) else (e.stdout or ""), None
    log.write_text(text)
    return rc, text


def first_failure(text: str) -> str:
    m = re.search(r"^FAILED (\S+)", text, re.M)
    return m.group(1) if m else ""


def judge(m: Mutant, rc: int | None, text: str, log: Path) -> tuple[str, str]:
    if rc is None:
        return "error", f"timed out (log: {log})"
    if m.command:
        return ("caught", "the command failed") if rc != 0 else ("MISSED", "the command passed")
    if rc == 1:
        return "caught", first_failure(text) or "a test failed"
    if rc == 0:
        return "MISSED", "every selected test passed"
    return "error", f"pytest exit {rc} (log: {log})"


def apply(m: Mutant, tree: Path) -> str | None:
    """Write the bug into the copy; the original text, or None when the mutant is stale."""
    f = tree / m.path
    if not f.is_file():
        return None
    text = f.read_text()
    if text.count(m.old) != 1:
        return None
    f.write_text(text.replace(m.old, m.new))
    return text


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                    help="cpu: the interpreter, lavapipe and the cpu backend (CI); cuda: the GPU machine")
    ap.add_argument("--only", action="append", metavar="NAME", help="only this mutant (repeatable)")
    ap.add_argument("--list", action="store_true", help="print the mutants and exit")
    ap.add_argument("--check", action="store_true", help="only check that every mutant applies (none stale)")
    ap.add_argument("--no-baseline", dest="baseline", action="store_false",
                    help="do not first run each set of tests unmutated (they must pass there)")
    ap.add_argument("--tree", type=Path, default=ROOT, help="the working tree to copy (default: this one)")
    ap.add_argument("--timeout", type=float, default=3600.0, help="seconds per mutant run (default 3600)")
    ap.add_argument("--keep", action="store_true", help="keep the copy and the logs")
    a = ap.parse_args(argv)

    names = {m.name for m in MUTANTS}
    unknown = set(a.only or ()) - names
    if unknown:
        ap.error(f"unknown mutant(s) {sorted(unknown)}; known: {sorted(names)}")
    chosen = [m for m in MUTANTS if (not a.only or m.name in a.only) and (a.check or a.device in m.devices)]
    if a.list:
        for m in MUTANTS:
            print(f"{m.name} [{', '.join(m.devices)}]\n  {m.bug}\n  {m.path}\n  "
                  + ("\n  ".join(m.tests) if m.tests else " ".join(m.command[1:])) + "\n")
        return 0
    if a.check:
        stale = [m.name for m in chosen if (a.tree / m.path).is_file() is False
                 or (a.tree / m.path).read_text().count(m.old) != 1]
        print("stale: " + ", ".join(stale) if stale else f"all {len(chosen)} mutants apply to {a.tree}")
        return 1 if stale else 0

    work = Path(tempfile.mkdtemp(prefix="minfer-mutants-"))
    tree = work / "tree"
    copy_tree(a.tree.resolve(), tree)
    print(f"{len(chosen)} mutants on a copy of {a.tree} in {tree} (--device {a.device})", flush=True)
    outcomes: list[Outcome] = []
    baseline: dict[tuple, str] = {}  # the tests (or command) -> "" when they pass unmutated, else what failed
    try:
        for m in chosen:
            t0 = time.monotonic()
            log = work / f"{m.name}.log"
            key = m.command or m.tests
            if a.baseline and key not in baseline:
                rc, text = run_tests(m, tree, a.device, a.timeout, work / f"{m.name}.baseline.log")
                baseline[key] = "" if rc == 0 else (first_failure(text) or f"exit {rc}")
            if a.baseline and baseline[key]:
                outcomes.append(Outcome(m, "error", f"fails unmutated: {baseline[key]}", time.monotonic() - t0))
                print(f"  {m.name}: error (its tests fail unmutated: {baseline[key]})", flush=True)
                continue
            original = apply(m, tree)
            if original is None:
                outcomes.append(Outcome(m, "stale", f"{m.path}: the text to replace is not found exactly once"))
                print(f"  {m.name}: stale", flush=True)
                continue
            try:
                rc, text = run_tests(m, tree, a.device, a.timeout, log)
            finally:
                (tree / m.path).write_text(original)
            result, detail = judge(m, rc, text, log)
            outcomes.append(Outcome(m, result, detail, time.monotonic() - t0))
            print(f"  {m.name}: {result} ({outcomes[-1].seconds:.0f} s) {detail}", flush=True)
    finally:
        if not a.keep:
            shutil.rmtree(work, ignore_errors=True)
    print_table(outcomes, a.device)
    if a.keep:
        print(f"copy and logs kept in {work}")
    return 0 if outcomes and all(o.result == "caught" for o in outcomes) else 1


def print_table(outcomes: list[Outcome], device: str) -> None:
    w = max([len(o.mutant.name) for o in outcomes] + [6])
    print(f"\n{'mutant':<{w}}  device  result   seconds  caught by / why")
    for o in outcomes:
        print(f"{o.mutant.name:<{w}}  {device:<6}  {o.result:<7}  {o.seconds:7.0f}  {o.detail}")
    n = sum(o.result == "caught" for o in outcomes)
    print(f"\n{n} of {len(outcomes)} caught")


if __name__ == "__main__":
    sys.exit(main())
