"""Honest numbers on screen (issue 23, item 7): the first prefill says it carries the one-time
warm-up, -n 1 reports no decode rate, chat counts the prompt tokens it ran (the reused prefix
apart), -n past the context warns, `minfer batch` error records keep their id and share the
server's bounds, and the README's streaming snippet ends its line."""

from __future__ import annotations

import json
import re
from pathlib import Path

import minfer
from minfer.cli import main

README = Path(minfer.__file__).resolve().parent.parent / "README.md"


def test_first_prefill_says_it_includes_warm_up(run_cli, tiny_gguf):
    rc, _, err = run_cli(["run", "-m", str(tiny_gguf()), "-n", "3", "--temp", "0", "hi"])
    assert rc == 0 and "the first step: includes one-time warm-up" in err


def test_one_token_reports_no_decode_rate(run_cli, tiny_gguf):
    rc, _, err = run_cli(["run", "-m", str(tiny_gguf()), "-n", "1", "--temp", "0", "--ignore-eos", "hi"])
    assert rc == 0 and not re.search(r"(?<![\d.])0\.0 tok/s", err)  # (a prefill rate such as 790.0 tok/s is fine)
    assert "decode: none (the only token came from the prefill) | generated: 1 " in err


def test_chat_counts_the_tokens_it_ran(run_cli, tiny_gguf):
    """The second turn reuses the first turn's tokens from the slot: the stats say how many ran
    and how many were reused, and the two add up to the prompt."""
    from minfer.api import load

    from .conftest import chat_reference

    rc, _, err = run_cli(["chat", "-m", str(tiny_gguf()), "-n", "3", "--temp", "0", "--ignore-eos", "--stats"],
                         stdin="hello\nthe cat sat\n")
    lines = [x for x in err.splitlines() if x.startswith("prefill:")]
    assert rc == 0 and len(lines) == 2
    assert "reused" not in lines[0]
    m2 = re.match(r"prefill: (\d+) tokens, (\d+) reused in", lines[1])
    assert m2, lines[1]
    (first,) = chat_reference(tiny_gguf(), ["hello"], 3, ignore_eos=True)
    with load(tiny_gguf(), progress=False) as m:
        n_prompt = len(m.chat_tokens([{"role": "user", "content": "hello"}, {"role": "assistant", "content": first},
                                      {"role": "user", "content": "the cat sat"}]))
    ran, reused = int(m2.group(1)), int(m2.group(2))
    assert ran + reused == n_prompt and 0 < ran < n_prompt


def test_n_past_the_context_warns(run_cli, tiny_gguf):
    rc, _, err = run_cli(["run", "-m", str(tiny_gguf()), "-n", "200", "-c", "32", "--temp", "0", "hi"])
    assert rc == 0 and re.search(r"warning: -n/--n-predict 200 is more than the context leaves: 32 tokens "
                                 r"\(-c/--ctx-size\) - \d+ of prompt = at most \d+ generated", err)
    rc, _, err = run_cli(["run", "-m", str(tiny_gguf()), "-n", "8", "-c", "32", "--temp", "0", "hi"])
    assert rc == 0 and "warning" not in err


def test_prompt_past_the_context_is_one_error_and_no_warning(run_cli, tiny_gguf):
    """A prompt longer than the context is the context error alone (was: first a warning that
    'at most 0' tokens follow from '32 - 301 of prompt', then the error)."""
    rc, _, err = run_cli(["run", "-m", str(tiny_gguf()), "-c", "32", "--temp", "0", "hello " * 300])
    assert rc == 2 and "warning" not in err, err
    assert re.search(r"the prompt has \d+ tokens but the context holds 32", err), err
    # a prompt that fills the context exactly: the error the resident process's server gives (was, in
    # process: 'at most 0 generated', then one token generated past the context's end anyway)
    from minfer.api import load

    with load(tiny_gguf(), progress=False) as m:
        n = len(m.tokenize("hello hello hello"))
    rc, out, err = run_cli(["run", "-m", str(tiny_gguf()), "-c", str(n), "--no-daemon", "--temp", "0",
                            "hello hello hello"])
    assert rc == 2 and "warning" not in err and out == "", err
    assert f"the prompt has {n} tokens and the context holds {n}: no room to generate" in err, err


def test_batch_errors_keep_the_id_and_share_the_servers_bounds(tiny_gguf, tmp_path, capsys):
    from minfer.server.schema import CompletionRequest, max_tokens_of, sampling_params

    lines = [{"id": "zero", "prompt": "x", "max_tokens": 0}, {"id": "hot", "prompt": "x", "temperature": 5},
             {"id": 7, "prompt": "x", "max_tokens": 2}, {"id": "bad", "prompt": "x", "nope": 1},
             {"id": "cold", "prompt": "x", "temperature": -1}]
    src, dst = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    src.write_text("".join(json.dumps(x) + "\n" for x in lines))
    assert main(["batch", "-m", str(tiny_gguf()), "--temp", "0", str(src), str(dst)]) == 0
    out = {r["index"]: r for r in map(json.loads, dst.read_text().splitlines())}
    assert [out[i].get("id") for i in range(5)] == ["zero", "hot", 7, "bad", "cold"]  # errors keep their id
    assert "error" not in out[2] and out[2]["completion_tokens"] == 2
    batch_errors = {i: out[i]["error"]["message"] for i in (0, 1, 4)}
    for i, message in batch_errors.items():  # the server says the same of the same fields
        req = CompletionRequest.model_validate({k: v for k, v in lines[i].items() if k != "id"})
        try:
            sampling_params(req, max_tokens_of(req))
            server = None
        except Exception as e:  # noqa: BLE001 (an APIError: its message)
            server = e.body()["error"]["message"]
        assert server is not None and (server in message or message in server), (message, server)


def test_batch_reads_messages_as_the_server_does(tiny_gguf, tmp_path):
    """A batch line's `messages` in OpenAI's shapes: text parts are the text; an empty list, a
    missing content and an image part are error records with the server's words (an empty list
    generated 256 tokens from an empty chat, the others were template TypeErrors)."""
    lines = [{"id": "str", "messages": [{"role": "user", "content": "hi there"}], "max_tokens": 3},
             {"id": "parts", "messages": [{"role": "user", "content": [{"type": "text", "text": "hi "},
                                                                      {"type": "text", "text": "there"}]}],
              "max_tokens": 3},
             {"id": "empty", "messages": []},
             {"id": "none", "messages": [{"role": "user", "content": None}]},
             {"id": "image", "messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]}]
    src, dst = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    src.write_text("".join(json.dumps(x) + "\n" for x in lines))
    assert main(["batch", "-m", str(tiny_gguf()), "--temp", "0", str(src), str(dst)]) == 0
    out = {r["id"]: r for r in map(json.loads, dst.read_text().splitlines())}
    assert out["parts"]["token_ids"] == out["str"]["token_ids"] and out["str"]["completion_tokens"] == 3
    assert out["empty"]["error"]["message"] == "messages must hold at least one message"
    assert out["none"]["error"]["message"] == "messages[0].content is missing"
    assert "only text parts are supported (got type 'image_url')" in out["image"]["error"]["message"]


def test_readme_streaming_snippet_ends_its_line(smollm2_path):
    """Run the README's Python API snippet, its print calls recorded: after the streamed pieces
    (end="") comes a print that ends the line, before the batch results print."""
    text = README.read_text()
    block = text.split("## Python API", 1)[1].split("```python", 1)[1].split("```", 1)[0]
    block = block.replace("max_tokens=32", "max_tokens=4").replace("max_tokens=16", "max_tokens=3")
    calls = []

    def record(*args, end="\n", **kw):
        calls.append((args, end))

    exec(compile(block, "README.md", "exec"), {"print": record})  # noqa: S102 (our own README)
    streamed = [i for i, (_, end) in enumerate(calls) if end == ""]
    assert streamed, calls
    after = calls[streamed[-1] + 1]
    assert after[1] == "\n" and "".join(map(str, after[0])) == ""  # a bare print(): the line ends
    assert len(calls) == streamed[-1] + 2 + 2  # then the two batch results, one line each


def _batch_stderr(tiny_gguf, tmp_path, on_terminal: bool) -> str:
    """stderr of `minfer batch` (two requests) written to a pipe, or to a pseudo-terminal."""
    import fcntl
    import os
    import pty
    import struct
    import subprocess
    import sys
    import termios

    requests = tmp_path / "in.jsonl"
    requests.write_text('{"id": "a", "prompt": "hi", "max_tokens": 2}\n{"id": "b", "prompt": "yo", "max_tokens": 2}\n')
    argv = [sys.executable, "-m", "minfer", "batch", "-m", str(tiny_gguf()), str(requests), str(tmp_path / "out.jsonl")]
    env = dict(os.environ, PYTHONPATH=str(README.parent), MINFER_CACHE=str(tmp_path / "cache"))
    if not on_terminal:
        return subprocess.run(argv, capture_output=True, text=True, env=env, timeout=300, check=True).stderr
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 120, 0, 0))  # 0 x 0: tqdm prints nothing
    p = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=slave, env=env)
    os.close(slave)
    got = b""
    while True:
        try:
            chunk = os.read(master, 1 << 16)
        except OSError:  # EIO: the process closed its end
            break
        if not chunk:
            break
        got += chunk
    os.close(master)
    assert p.wait(timeout=300) == 0, got[-2000:]
    return got.decode(errors="replace")


def test_progress_bars_only_on_a_terminal(tiny_gguf, tmp_path):
    bar = re.compile(r"batch: \d+req \[")  # tqdm's "batch: 2req [00:00, 29.8req/s]"
    piped = _batch_stderr(tiny_gguf, tmp_path, on_terminal=False)
    assert "minfer batch: 2 requests" in piped and not bar.search(piped)  # a pipe: the summary, no bar
    assert bar.search(_batch_stderr(tiny_gguf, tmp_path, on_terminal=True))  # a terminal: the bar


def test_batch_refuses_to_write_over_its_input(run_cli, tiny_gguf, tmp_path):
    """OUT.jsonl naming the input file (itself, or a link to it) is an error before anything is
    written (was: the input emptied by opening it for writing, then '0 requests')."""
    src = tmp_path / "in.jsonl"
    text = json.dumps({"prompt": "hi", "max_tokens": 2}) + "\n"
    src.write_text(text)
    (tmp_path / "link.jsonl").symlink_to(src)
    for out in (src, tmp_path / "." / "in.jsonl", tmp_path / "link.jsonl"):
        rc, _, err = run_cli(["batch", "-m", str(tiny_gguf()), str(src), str(out)])
        assert rc == 2 and "is the input file" in err, err
        assert src.read_text() == text


def test_batch_output_that_cannot_be_written_is_one_error(run_cli, tiny_gguf, tmp_path):
    """A full disk (/dev/full: every write fails with ENOSPC) is the typed error naming OUT.jsonl
    (was: an OSError traceback from the flush, then another from closing the file)."""
    src = tmp_path / "in.jsonl"
    src.write_text(json.dumps({"prompt": "hi", "max_tokens": 2}) + "\n")
    rc, _, err = run_cli(["batch", "-m", str(tiny_gguf()), str(src), "/dev/full"])
    assert rc == 2 and "cannot write /dev/full: No space left on device" in err, err


def test_output_that_cannot_be_written_is_one_line_and_exit_1(tiny_gguf):
    """`minfer inspect FILE > /dev/full` and `minfer run ... > /dev/full` (every write fails with ENOSPC):
    one error line on stderr and exit 1 (was: an OSError traceback, then the interpreter's own at exit)."""
    import os
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": str(root), "MINFER_CACHE": str(Path(tiny_gguf()).parent / "cache")}
    path = str(tiny_gguf())
    for argv in (["inspect", path], ["run", "--no-daemon", "-m", path, "-n", "4", "--temp", "0", "hi"]):
        with open("/dev/full", "w") as full:
            out = subprocess.run([sys.executable, "-m", "minfer", *argv], stdout=full, stderr=subprocess.PIPE,
                                 env=env, text=True, timeout=300)
        assert out.returncode == 1, out.stderr[-2000:]
        assert "Traceback" not in out.stderr and "Exception ignored" not in out.stderr, out.stderr[-2000:]
        assert "minfer: error: cannot write: No space left on device" in out.stderr, out.stderr
