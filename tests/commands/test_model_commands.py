"""`minfer run`, `chat` and `perplexity` through the command line (minfer.cli.main)."""

from __future__ import annotations

import re

import pytest


def test_run_default_model_streams_text_and_reports_speed(run_cli):
    rc, out, err = run_cli(["run", "-n", "6", "--temp", "0", "The capital of France is"])
    assert rc == 0 and out.startswith(" Paris")
    # 6 generated: the first from the prefill's logits, 5 decode steps
    assert re.search(r"prefill: \d+ tokens in .* tok/s.*\) \| decode: 5 tokens in .* tok/s\) \| generated: 6 ", err)


def test_run_with_trace(tiny_gguf, run_cli, tmp_path):
    trace = tmp_path / "t.json"
    rc, out, _ = run_cli(["run", "-m", str(tiny_gguf()), "-n", "3", "--seed", "1", "--trace", str(trace), "hi"])
    assert rc == 0 and trace.stat().st_size > 0


def test_chat_keeps_history_and_handles_commands(tiny_gguf, run_cli):
    rc, out, err = run_cli(["chat", "-m", str(tiny_gguf()), "-n", "4", "--temp", "0", "--stats"],
                             stdin="hello\n\n/reset\nagain\n/exit\nnever read\n")
    assert rc == 0
    assert "(history cleared)" in err
    assert err.count("decode:") == 2  # one stats line per reply: the empty line and /exit's tail got none


def test_chat_replies_are_the_models_replies(tiny_gguf, run_cli):
    """Two turns through `minfer chat` print what Model.generate gives for the same conversation."""
    from .conftest import chat_reference

    rc, out, _ = run_cli(["chat", "-m", str(tiny_gguf()), "-n", "5", "--temp", "0"], stdin="hello\nthe cat\n/exit\n")
    first, second = chat_reference(tiny_gguf(), ["hello", "the cat"], 5)
    assert rc == 0 and out == first + "\n" + second + "\n"


def test_chat_reports_overflow_and_continues(tiny_gguf, run_cli):
    argv = ["chat", "-m", str(tiny_gguf()), "-c", "24", "-n", "2", "--temp", "0", "--stats"]
    rc, out, err = run_cli(argv, stdin="word " * 40 + "\nhi\n")
    assert rc == 0 and "error:" in err and "/reset" in err
    assert err.count("decode:") == 1  # the second message still got its reply


def test_perplexity_prints_chunks_and_final(tiny_gguf, run_cli, tmp_path):
    text = tmp_path / "t.txt"
    text.write_text("the quick brown fox jumps over the lazy dog. " * 40)
    rc, out, _ = run_cli(["perplexity", "-m", str(tiny_gguf()), "--chunk", "64", str(text)])
    assert rc == 0
    assert re.search(r"\[1/\d+\] running PPL = [\d.]+", out)
    m = re.search(r"PPL = ([\d.]+) \+/- ([\d.]+)", out)
    from minfer.api import load

    with load(tiny_gguf(), n_ctx=64, progress=False) as model:  # the same computation through the API
        want = model.perplexity(text.read_text(), n_ctx=64)
    assert m and float(m.group(1)) == pytest.approx(want.ppl, rel=1e-3)
    assert float(m.group(2)) == pytest.approx(want.ppl_error, rel=1e-2, abs=1e-3)


def test_perplexity_unreadable_file(run_cli, tiny_gguf, tmp_path):
    rc, _, err = run_cli(["perplexity", "-m", str(tiny_gguf()), str(tmp_path / "missing.txt")])
    assert rc == 2 and "cannot read" in err


def test_bench_reports_the_table_and_json(run_cli, tiny_gguf):
    import json

    rc, out, err = run_cli(["bench", "-m", str(tiny_gguf()), "-p", "32", "-n", "6", "-b", "1,3", "-r", "1"])
    assert rc == 0
    for test in ("pp32", "tg6", "b1", "b3", "b1e2e", "b3e2e"):
        assert re.search(rf"\b{test}\s+[\d.]+ ±", out), out
    assert "copy bandwidth" in err and "cpu kernels: " in err  # the cpu path it took (issue 26 item 5)
    rc, out, _ = run_cli(["bench", "-m", str(tiny_gguf()), "-p", "16", "-n", "4", "-r", "2", "--json"])
    doc = json.loads(out)
    tg = next(r for r in doc["results"] if r["test"] == "tg4")
    assert rc == 0 and len(tg["runs"]) == 2 and tg["tok_s"] > 0 and tg["gbs"] > 0 and doc["weight_bytes_per_token"] > 0
    assert doc["cpu_isa"] in ("amx", "avx512", "avxvnni", "avx2", "torch") and doc["cpu_prompt_passes"] == 1
    rc, _, err = run_cli(["bench", "-m", str(tiny_gguf()), "-r", "0"])
    assert rc == 2 and "-r must be >= 1" in err
    rc, _, err = run_cli(["bench", "-m", str(tiny_gguf()), "-b", "1,abc"])  # was: a ValueError traceback
    assert rc == 2 and "-b/--batch takes batch sizes separated by commas" in err and "'1,abc'" in err
    rc, out, err = run_cli(["bench", "-m", "/nonexistent/never-loaded.gguf", "-p", "8", "-n", "4", "-c", "4"])
    assert rc == 2 and "-c/--ctx-size 4 is too small for these tests" in err and out == ""  # before any load
