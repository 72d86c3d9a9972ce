"""What a llama.cpp user expects of the command line: fast help, flags checked before the model
loads and named in errors, prompts from -p / -f / stdin, warnings, Ctrl-C in chat, trace notice."""

from __future__ import annotations

import io
import subprocess
import sys

import pytest

from minfer.cli import main  # noqa: F401  (some tests call it directly)


@pytest.mark.parametrize("argv", [["--help"], ["inspect"], ["run", "--help"], ["kernels", "--help"]])
def test_help_and_inspect_do_not_import_torch(argv, smollm2_path):
    code = ("import sys; from minfer.cli import main\n"
            "try:\n    main(sys.argv[1:])\nexcept SystemExit:\n    pass\n"
            "print('TORCH' if 'torch' in sys.modules else 'NO-TORCH')")
    proc = subprocess.run([sys.executable, "-c", code, *argv], capture_output=True, text=True, timeout=60,
                          env={"MINFER_MODEL": str(smollm2_path), "PATH": ""})
    assert proc.stdout.strip().splitlines()[-1] == "NO-TORCH", proc.stderr[-2000:]


@pytest.mark.parametrize("flags,message", [
    (["-n", "0"], "-n/--n-predict must be >= 1"),
    (["-n", "-5"], "-n/--n-predict must be >= 1"),
    (["--temp", "-1"], "--temp must be >= 0.0"),
    (["--top-p", "0"], "--top-p must be > 0.0"),
    (["--min-p", "2"], "--min-p must be <= 1.0"),
    (["--top-k", "-3"], "--top-k must be >= 0"),
    (["-c", "0"], "-c/--ctx-size must be >= 1"),
    (["-t", "0"], "-t/--threads must be >= 1"),
    (["--prefill-chunk", "0"], "--prefill-chunk must be >= 1"),
    (["--repeat-penalty", "0"], "--repeat-penalty must be > 0.0"),
    (["--presence-penalty", "9"], "--presence-penalty must be <= 2.0"),
    (["--spec", "ngram", "--draft-max", "0"], "--draft-max must be >= 1"),
    (["--spec", "ngram", "--draft-ngram-min", "5"], "--draft-ngram-min must be >= 1 and <= 3"),
    (["--spec", "model"], "-md/--model-draft is the draft model of spec 'model'"),
    (["--spec", "medusa"], "--spec must be 'ngram' or 'model' (or '' for off), got 'medusa'"),
])
def test_bad_flags_fail_before_the_model_loads_and_name_the_flag(run_cli, flags, message, tmp_path):
    missing = tmp_path / "no-such-model.gguf"  # never opened: the flags are checked first
    rc, out, err = run_cli(["run", "-m", str(missing), *flags, "hello"])
    assert rc == 2 and message in err and "no-such-model" not in err, err


def test_prompt_from_file_flag_and_stdin_agree(tiny_gguf, tmp_path, run_cli):
    model = str(tiny_gguf())
    common = ["run", "-m", model, "-n", "5", "--temp", "0"]
    f = tmp_path / "p.txt"
    f.write_text("hello there")
    outs = [run_cli(common + ["hello there"])[1], run_cli(common + ["-p", "hello there"])[1],
            run_cli(common + ["-f", str(f)])[1],
            run_cli(common + ["-"], stdin="hello there")[1]]
    assert len(set(outs)) == 1 and outs[0].strip()
    rc, _, err = run_cli(common + ["-p", "a", "b"])
    assert rc == 2 and "give the prompt once" in err
    rc, _, err = run_cli(common + ["-f", str(tmp_path / "nope.txt")])
    assert rc == 2 and "-f/--file" in err


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_no_prompt_reads_a_piped_stdin_and_chats_at_a_terminal(tiny_gguf, run_cli, monkeypatch, rendered_prompts):
    """`echo text | minfer run` takes the pipe as its prompt (Ollama's `ollama run`), no chat template;
    with no prompt at a terminal it is a chat (its first line the user's first message), and -no-cnv
    there is a typed error."""
    model = str(tiny_gguf())
    common = ["run", "-m", model, "-n", "5", "--temp", "0", "--no-daemon"]
    rc, piped, err = run_cli(common, stdin="hello there")
    assert rc == 0, err
    assert piped == run_cli(common + ["hello there"])[1] and piped.strip() and rendered_prompts == []
    monkeypatch.setattr("sys.stdin", _Terminal("hello there\n"))
    rc, _, err = run_cli(common)
    assert rc == 0, err
    assert len(rendered_prompts) == 1 and "hello there" in rendered_prompts[0]
    monkeypatch.setattr("sys.stdin", _Terminal(""))
    rc, _, err = run_cli(common + ["-no-cnv"])
    assert rc == 2 and "no prompt" in err, err


def test_context_past_training_warns(run_cli, tiny_gguf):
    rc, _, err = run_cli(["run", "-m", str(tiny_gguf()), "-c", "1024", "-n", "2", "--temp", "0", "hi"])
    assert rc == 0 and "warning: -c/--ctx-size 1024 is past the model's training context (512)" in err
    rc, _, err = run_cli(["run", "-m", str(tiny_gguf()), "-c", "256", "-n", "2", "--temp", "0", "hi"])
    assert rc == 0 and "warning" not in err


def test_ignore_eos_and_unlimited_tokens(run_cli, tiny_gguf):
    rc, _, err = run_cli(["run", "-m", str(tiny_gguf()), "-c", "24", "-n", "-1", "--ignore-eos", "--temp", "0",
                       "hi"])
    assert rc == 0 and "stop: length" in err  # ran to the end of the 24-token context


def test_minfer_trace_says_where_the_trace_went(tiny_gguf, tmp_path, run_cli, monkeypatch):
    path = tmp_path / "t.json"
    monkeypatch.setenv("MINFER_TRACE", str(path))
    rc, _, err = run_cli(["run", "-m", str(tiny_gguf()), "-n", "2", "--temp", "0", "hi"])
    assert rc == 0 and f"trace written to {path}" in err and path.stat().st_size > 0


def test_chat_template_file_replaces_the_models(tiny_gguf, tmp_path, run_cli, rendered_prompts):
    seen = rendered_prompts
    tpl = tmp_path / "t.jinja"
    tpl.write_text("{% for m in messages %}[{{ m.role }}] {{ m.content }}\n{% endfor %}ASSISTANT:")
    rc, _, _ = run_cli(["chat", "-m", str(tiny_gguf()), "-n", "2", "--temp", "0", "--chat-template", str(tpl)],
                       stdin="hello\n")
    assert rc == 0 and seen == ["[user] hello\nASSISTANT:"]
    bad = tmp_path / "bad.jinja"
    bad.write_text("{% for %}")
    rc, _, err = run_cli(["chat", "-m", str(tiny_gguf()), "--chat-template", str(bad)], stdin="")
    assert rc == 2 and "chat template syntax error" in err


def test_ctrl_c_in_chat_stops_the_reply_not_the_session(tiny_gguf, run_cli, monkeypatch):
    import minfer.api

    real = minfer.api.Model.generate
    calls = []

    def interrupted(self, prompt, **kw):
        calls.append(list(prompt))
        if len(calls) > 1:
            return real(self, prompt, **kw)

        def pieces():
            yield "partial"
            raise KeyboardInterrupt

        return pieces()

    monkeypatch.setattr(minfer.api.Model, "generate", interrupted)
    rc, out, err = run_cli(["chat", "-m", str(tiny_gguf()), "-n", "3", "--temp", "0"], stdin="first\nsecond\n")
    assert rc == 0 and "[stopped]" in err and len(calls) == 2
    assert calls[1][-2] == {"role": "assistant", "content": "partial"}  # the stopped reply stays in the history


@pytest.mark.parametrize("key", ["", "  "])
def test_serve_refuses_an_empty_api_key(run_cli, tmp_path, key):
    """`--api-key "$KEY"` with KEY unset: one error before anything loads or listens (it served with
    no key at all, every request let in, while the command line asked for one)."""
    missing = tmp_path / "no-such-model.gguf"
    rc, _, err = run_cli(["serve", "-m", str(missing), "--port", "0", "--api-key", key])
    assert rc == 2 and "--api-key is empty" in err and "no-such-model" not in err, err
