"""`minfer run` through a resident model process (commands/resident.py, Ollama's keep-alive): the
first run starts one, later runs with the same settings stream from it and print what the
in-process run prints, other settings get another process, a stale state file is replaced, an idle
process exits, `minfer ps` / `minfer stop` see and end them, Ctrl-C aborts the request and leaves
the process, and the client imports no torch. Real processes, short keep-alives; every process a
test starts is stopped by the fixture."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
NOTICE = "model kept loaded for"
KEEP = "60s"


@pytest.fixture
def resident_env(tmp_path, monkeypatch):
    """A fresh MINFER_CACHE for this test and its subprocesses; afterwards every resident process
    it started is stopped (SIGKILL after a grace period) and none is left."""
    cache = tmp_path / "cache"
    monkeypatch.setenv("MINFER_CACHE", str(cache))
    env = {**os.environ, "PYTHONPATH": str(ROOT), "MINFER_CACHE": str(cache)}
    pids: set[int] = set()
    yield env, pids
    from minfer.commands import resident

    for st in resident.all_states():
        pids.add(st.pid)
        resident.stop(st, wait_s=5)
    for pid in pids:
        if resident.process_alive(pid):
            os.kill(pid, signal.SIGKILL)


def minfer(env, *argv, check: bool = True) -> subprocess.CompletedProcess:
    """Run `python -m minfer ARGV`; its output as text, byte for byte (no newline translation: a
    sampled "\r" stays one)."""
    out = subprocess.run([sys.executable, "-m", "minfer", *argv], capture_output=True, env=env, timeout=300)
    out.stdout, out.stderr = out.stdout.decode(), out.stderr.decode()
    if check:
        assert out.returncode == 0, out.stderr[-3000:]
    return out


def states(cache: str) -> list[dict]:
    d = Path(cache) / "resident"
    return [json.loads(f.read_text()) for f in sorted(d.glob("*.json"))] if d.is_dir() else []


def tail(stderr: str) -> str:
    """The stats line's counts (its timings differ from run to run)."""
    line = [x for x in stderr.splitlines() if x.startswith("prefill:")][-1]
    return line.split(" | ", 2)[2]  # "generated: N | stop: R"


def in_process(run_cli, argv) -> tuple[str, str]:
    rc, out, err = run_cli(["run", *argv, "--no-daemon"])
    assert rc == 0, err
    return out, tail(err)


CASES = [  # greedy; seeded sampling with every filter; a stop string; penalties
    ["-n", "12", "--temp", "0", "hello world"],
    ["-n", "12", "--temp", "0.9", "--top-k", "20", "--top-p", "0.9", "--min-p", "0.02", "-s", "7", "hello world"],
    ["-n", "16", "--temp", "0.8", "-s", "3", "--stop", "g", "the"],
    ["-n", "12", "--temp", "0.7", "-s", "11", "--repeat-penalty", "1.3", "--presence-penalty", "0.5",
     "--frequency-penalty", "0.2", "--repeat-last-n", "8", "abc"],
]


def test_second_run_connects_and_prints_what_the_in_process_run_prints(resident_env, run_cli, tiny_gguf):
    env, pids = resident_env
    model = ["-m", str(tiny_gguf("tiny-llama", "q4_k"))]
    first = minfer(env, "run", *model, "--keep-alive", KEEP, *CASES[0])
    assert NOTICE in first.stderr  # said once, when the process starts
    (st,) = states(env["MINFER_CACHE"])
    pids.add(st["pid"])
    assert st["status"] == "ready" and st["url"].startswith("http://127.0.0.1:")
    assert oct(Path(env["MINFER_CACHE"], "resident", f"{st['key']}.json").stat().st_mode & 0o777) == "0o600"
    for argv in CASES:
        want_out, want_tail = in_process(run_cli, [*model, *argv])
        got = minfer(env, "run", *model, "--keep-alive", KEEP, *argv)
        assert NOTICE not in got.stderr  # no noise on later runs
        assert got.stdout == want_out, argv
        assert tail(got.stderr) == want_tail, argv
    assert first.stdout == in_process(run_cli, [*model, *CASES[0]])[0]
    assert [s["pid"] for s in states(env["MINFER_CACHE"])] == [st["pid"]]  # one process served every run

    # the client side imports no torch / numpy / server stack
    probe = ("import sys; from minfer.cli import main; rc = main(sys.argv[1:]); "
             "heavy = sorted(m for m in sys.modules if m.split('.')[0] in "
             "('torch', 'numpy', 'jinja2', 'fastapi', 'uvicorn', 'httpx', 'triton')); "
             "print('HEAVY', rc, heavy, file=sys.stderr)")
    out = subprocess.run([sys.executable, "-c", probe, "run", *model, "--keep-alive", KEEP, *CASES[0]],
                         capture_output=True, text=True, env=env, timeout=120)
    assert "HEAVY 0 []" in out.stderr, out.stderr[-2000:]


def _default_ctrl_c() -> None:
    """A terminal's Ctrl-C for the client: a test worker may run with SIGINT ignored (something
    earlier in the same process set it so), which a child inherits, and then Python never installs
    its KeyboardInterrupt handler (the client ran to its end, exit 0, in two full-suite runs)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def test_ctrl_c_aborts_the_request_and_leaves_the_process(resident_env, tiny_gguf):
    env, pids = resident_env
    # a context of 8192 (the tiny model's own is 512, which it fills in ~0.3 s: the run could end before
    # the signal arrives on a busy machine)
    model = ["-m", str(tiny_gguf("tiny-llama", "q4_k")), "-c", "8192", "--keep-alive", KEEP]
    minfer(env, "run", *model, "-n", "2", "--temp", "0", "hi")
    (st,) = states(env["MINFER_CACHE"])
    pids.add(st["pid"])
    p = subprocess.Popen([sys.executable, "-m", "minfer", "run", *model,
                          "--ignore-eos", "--temp", "0", "-n", "-1", "go"], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, env=env, preexec_fn=_default_ctrl_c)
    assert p.stdout.read(1)  # generating
    p.send_signal(signal.SIGINT)
    _, err = p.communicate(timeout=30)
    assert p.returncode == 130 and "interrupted" in err.decode()
    from minfer.commands import resident

    client = resident.Client(st["url"], st["token"])
    deadline = time.monotonic() + 10
    while True:  # the server saw the client go and aborted the request: its slot is free
        _, slots = client.json("GET", "/slots")
        if not slots[0]["is_processing"]:
            break
        assert time.monotonic() < deadline, "the request was not aborted"
        time.sleep(0.1)
    assert resident.process_alive(st["pid"])
    again = minfer(env, "run", *model, "-n", "3", "--temp", "0", "hi")
    assert NOTICE not in again.stderr and "generated: 3" in again.stderr


def test_other_settings_get_another_process_and_ps_stop_see_them(resident_env, run_cli, tiny_gguf):
    env, pids = resident_env
    path = tiny_gguf("tiny-llama", "q4_k")
    base = ["run", "-m", str(path), "--keep-alive", KEEP, "-n", "2", "--temp", "0", "hi"]
    minfer(env, *base)
    long = ["-c", "24", "-n", "40", "-s", "5", "--temp", "0.8", "--ignore-eos"]  # another context: another process
    other = minfer(env, *base, *long)
    assert NOTICE in other.stderr
    rc, want, err = run_cli([*base, *long, "--no-daemon"])  # -n past the context: the same warning, the same tokens
    warning = [x for x in err.splitlines() if "more than the context leaves" in x]
    assert rc == 0 and len(warning) == 1 and warning[0] in other.stderr
    assert other.stdout == want and tail(other.stderr) == tail(err)
    sts = states(env["MINFER_CACHE"])
    pids.update(s["pid"] for s in sts)
    assert len(sts) == 2 and sts[0]["pid"] != sts[1]["pid"]
    assert {s["options"]["config"]["n_ctx"] for s in sts} == {None, 24}
    listed = json.loads(minfer(env, "ps", "--json").stdout)
    assert sorted(r["pid"] for r in listed) == sorted(s["pid"] for s in sts)
    assert all(r["model"] == path.name and isinstance(r["idle"], float) for r in listed)
    table = minfer(env, "ps").stdout
    assert table.startswith("MODEL") and table.count(path.name) == 2
    assert "no resident process serves" in minfer(env, "stop", "other.gguf", check=False).stderr
    stopped = minfer(env, "stop", path.stem)
    assert stopped.stderr.count("stopped") == 2
    from minfer.commands import resident

    assert not any(resident.process_alive(p) for p in pids)
    assert states(env["MINFER_CACHE"]) == []
    assert "no resident model processes" in minfer(env, "ps").stderr


def test_a_stale_state_file_is_replaced_by_a_fresh_process(resident_env, tiny_gguf):
    env, pids = resident_env
    argv = ["run", "-m", str(tiny_gguf("tiny-llama", "q4_k")), "--keep-alive", KEEP, "-n", "3", "--temp", "0", "hi"]
    want = minfer(env, *argv).stdout
    (st,) = states(env["MINFER_CACHE"])
    pids.add(st["pid"])
    os.kill(st["pid"], signal.SIGKILL)  # dies without removing its state file
    time.sleep(0.2)
    again = minfer(env, *argv)
    assert NOTICE in again.stderr and again.stdout == want
    (st2,) = states(env["MINFER_CACHE"])
    pids.add(st2["pid"])
    assert st2["pid"] != st["pid"]

    # a live process that refuses connections (here: the state file's port is wrong): ended, replaced
    file = Path(env["MINFER_CACHE"], "resident", f"{st2['key']}.json")
    file.write_text(json.dumps({**st2, "url": "http://127.0.0.1:9"}))
    third = minfer(env, *argv)
    assert NOTICE in third.stderr and third.stdout == want
    (st3,) = states(env["MINFER_CACHE"])
    pids.add(st3["pid"])
    from minfer.commands import resident

    assert st3["pid"] != st2["pid"] and not resident.process_alive(st2["pid"])

    # a file that is not a state file at all: ignored and overwritten
    Path(file).write_text("{not json")
    os.kill(st3["pid"], signal.SIGKILL)
    fourth = minfer(env, *argv)
    assert fourth.stdout == want and "Traceback" not in fourth.stderr
    pids.update(s["pid"] for s in states(env["MINFER_CACHE"]))


def test_an_idle_process_exits_after_its_keep_alive(resident_env, tiny_gguf):
    env, pids = resident_env
    minfer(env, "run", "-m", str(tiny_gguf("tiny-llama", "q4_k")), "--keep-alive", "2s", "-n", "2", "--temp", "0",
           "hi")
    (st,) = states(env["MINFER_CACHE"])
    pids.add(st["pid"])
    from minfer.commands import resident

    deadline = time.monotonic() + 30
    while resident.process_alive(st["pid"]):
        assert time.monotonic() < deadline, "the resident process outlived its keep-alive"
        time.sleep(0.2)
    assert states(env["MINFER_CACHE"]) == []  # it removed its state file


def test_keep_alive_zero_and_no_daemon_run_in_process(resident_env, tiny_gguf):
    env, _ = resident_env
    model = ["-m", str(tiny_gguf("tiny-llama", "q4_k")), "-n", "2", "--temp", "0", "hi"]
    for flags in (["--keep-alive", "0"], ["--no-daemon"]):
        out = minfer(env, "run", *model, *flags)
        assert NOTICE not in out.stderr and "one-time warm-up" in out.stderr  # the process's own first step
    assert states(env["MINFER_CACHE"]) == []
    for flags in ([], ["--no-daemon"], ["-cnv"]):  # checked wherever it would not apply too (was: ignored there)
        bad = minfer(env, "run", *model, "--keep-alive", "soon", *flags, check=False)
        assert bad.returncode == 2 and "--keep-alive expects a duration" in bad.stderr, (flags, bad.stderr)


def test_a_temperature_past_the_http_range_runs_in_process(resident_env, tiny_gguf):
    """--temp 5 is a valid run flag (the in-process run samples at it); the resident process's HTTP
    API takes at most 2.0, so the run goes in process instead (was: 'temperature must be <= 2.0')."""
    env, _ = resident_env
    model = ["-m", str(tiny_gguf("tiny-llama", "q4_k")), "-n", "2", "-s", "1", "--temp", "5", "hi"]
    out = minfer(env, "run", *model, "--keep-alive", KEEP, check=False)
    assert out.returncode == 0 and "generated: 2" in out.stderr, out.stderr
    assert out.stdout == minfer(env, "run", *model, "--no-daemon").stdout
    assert states(env["MINFER_CACHE"]) == []


def test_a_closed_stdout_ends_the_run_quietly_as_in_process(resident_env, tiny_gguf):
    """stdout closed under the run (`minfer run ... | head -c 3`): the resident run ends as the
    in-process one does, exit 0 and no error (was: exit 2, 'the resident process ended the request:
    [Errno 32] Broken pipe', blaming the process for the client's own pipe)."""
    env, _ = resident_env
    model = ["-m", str(tiny_gguf("tiny-llama", "q4_k")), "-n", "20", "--ignore-eos", "--temp", "0", "hi"]
    for flags in (["--no-daemon"], ["--keep-alive", KEEP], ["--keep-alive", KEEP]):  # in process, start, connect
        r, w = os.pipe()
        os.close(r)  # the reader is gone before the first byte: the first write fails, every time
        try:
            out = subprocess.run([sys.executable, "-m", "minfer", "run", *model, *flags], stdout=w,
                                 stderr=subprocess.PIPE, text=True, env=env, timeout=300)
        finally:
            os.close(w)
        assert out.returncode == 0 and "error" not in out.stderr, (flags, out.stderr)


def test_a_file_that_does_not_load_is_one_error_and_no_kept_loaded_notice(resident_env, tmp_path):
    """A model the resident process cannot load (not a GGUF file): the run says why, once, and does
    not claim the model is kept loaded; nothing is left running."""
    env, pids = resident_env
    bad = tmp_path / "not-a-model.gguf"
    bad.write_bytes(b"hello world, not a GGUF file")
    out = minfer(env, "run", "-m", str(bad), "--keep-alive", KEEP, "-n", "2", "hi", check=False)
    assert out.returncode == 2 and "expected b'GGUF'" in out.stderr, out.stderr
    assert NOTICE not in out.stderr and "Traceback" not in out.stderr, out.stderr
    assert states(env["MINFER_CACHE"]) == []


def test_the_resident_process_loads_with_the_runs_speculative_settings(tmp_path):
    """`minfer run --spec ... / -md FILE` through a resident process: the process's `serve` command
    line carries the speculative settings, so its engine config is the run's (the settings key
    that picks the process covers them too)."""
    from minfer.cli import build_parser
    from minfer.commands.common import engine_config
    from minfer.commands.resident import serve_argv

    draft = tmp_path / "small.gguf"
    for argv in (["run", "--spec", "ngram", "--draft-max", "5", "--draft-ngram-min", "1", "x"],
                 ["run", "-md", str(draft), "--draft-max", "3", "x"]):
        a = build_parser().parse_args(argv)
        served = build_parser().parse_args(serve_argv(a, tmp_path / "m.gguf", 60.0, tmp_path / "state")[3:])
        want, got = engine_config(a), engine_config(served)
        assert (got.spec, got.draft_max, got.draft_ngram_min, got.draft_model) == \
            (want.spec, want.draft_max, want.draft_ngram_min, want.draft_model) and want.spec


def _child(state_file: Path, on_term: str) -> subprocess.Popen:
    """A process whose command line names state_file (as a resident process's does); on SIGTERM
    it runs on_term ("exit slowly": sleeps 0.5 s, then exits; "ignore": keeps running)."""
    handler = {"exit slowly": "lambda *_: (time.sleep(0.5), sys.exit(0))", "ignore": "signal.SIG_IGN"}[on_term]
    code = (f"import signal, sys, time; signal.signal(signal.SIGTERM, {handler}); "
            "print('up', flush=True); time.sleep(60)")
    proc = subprocess.Popen([sys.executable, "-c", code, str(state_file)], stdout=subprocess.PIPE)
    assert proc.stdout.readline() == b"up\n"
    return proc


def test_stop_returns_only_once_the_pid_is_gone(tmp_path, monkeypatch):
    """`minfer stop` says "stopped" only when the process has exited, not when its command line
    stops naming the state file: an exiting process's /proc cmdline reads empty before it is gone
    (CI once saw a pid alive after "stopped 2"). Here the marker check turns False at SIGTERM
    while the process takes 0.5 s to exit; a process that ignores SIGTERM is killed; a pid that
    does not name the state file is never signalled."""
    from minfer.commands import resident

    file = tmp_path / "k.json"
    file.write_text(json.dumps({"format": resident.STATE_FORMAT, "pid": 0}))
    slow = _child(file, "exit slowly")
    st = resident.State(file, {"pid": slow.pid})
    real_alive, termed = resident.State.alive, []
    monkeypatch.setattr(resident.State, "alive", lambda self: not termed and real_alive(self))
    real_kill = os.kill
    monkeypatch.setattr(resident.os, "kill", lambda pid, sig: (sig and termed.append(sig), real_kill(pid, sig)))
    t0 = time.monotonic()
    assert resident.stop(st, wait_s=10)
    assert time.monotonic() - t0 >= 0.4 and slow.wait(timeout=5) == 0 and termed == [signal.SIGTERM]
    monkeypatch.undo()

    stubborn = _child(file, "ignore")
    assert resident.stop(resident.State(file, {"pid": stubborn.pid}), wait_s=0.3)
    assert stubborn.wait(timeout=5) == -signal.SIGKILL

    stranger = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        assert resident.stop(resident.State(file, {"pid": stranger.pid}), wait_s=0.3)
        assert stranger.poll() is None  # not ours: untouched
    finally:
        stranger.kill()
        stranger.wait()
