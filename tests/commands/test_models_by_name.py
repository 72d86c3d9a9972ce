"""Models by name (issue 23, item 2): `-hf OWNER/REPO[:QUANT]`, `-hff`, `-m URL`, `minfer pull`,
`list` and `rm`, through huggingface_hub against a stand-in Hub on 127.0.0.1 (HF_ENDPOINT):
no test reaches the internet."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

import minfer
from minfer.errors import MinferError
from minfer.hub import HFRef, pick_file

ROOT = Path(minfer.__file__).resolve().parent.parent
REPO = "someone/Tiny-Llama-GGUF"


def minfer_cli(args: list[str], env: dict, timeout: float = 180) -> subprocess.CompletedProcess:
    # the caller's token and offline switch stay out (another test may have set HF_HUB_OFFLINE in this process)
    full = {k: v for k, v in os.environ.items() if k not in ("HF_TOKEN", "HF_HUB_OFFLINE")}
    full.update(PYTHONPATH=str(ROOT), **env)
    return subprocess.run([sys.executable, "-m", "minfer", *args], capture_output=True, text=True, env=full,
                          timeout=timeout, stdin=subprocess.DEVNULL)


@pytest.fixture
def hub_env(tmp_path, stand_in_hub, tiny_gguf):
    """A stand-in Hub with one repository (a Q4_1 and a Q8_0 file and a projector beside them)
    and the environment that points a fresh Hugging Face cache and minfer cache at it."""
    q41, q80 = tiny_gguf("tiny-llama", "q4_1").read_bytes(), tiny_gguf("tiny-llama", "q8_0").read_bytes()
    hub = stand_in_hub({REPO: {"tiny-llama-Q4_1.gguf": q41, "tiny-llama-Q8_0.gguf": q80,
                               "mmproj-tiny-llama-Q4_1.gguf": b"not a model", "README.md": b"# tiny"}})
    env = {"HF_ENDPOINT": hub.url, "HF_HOME": str(tmp_path / "hf"), "MINFER_CACHE": str(tmp_path / "minfer"),
           "HF_HUB_DISABLE_TELEMETRY": "1", "HF_HUB_ETAG_TIMEOUT": "5"}
    return hub, env, q41


@pytest.mark.parametrize("files,tag,want", [
    (["a-Q8_0.gguf", "a-Q4_1.gguf"], "q4_1", "a-Q4_1.gguf"),           # case-insensitive
    (["a-Q4_1.gguf", "a-Q4_K_M.gguf", "a-Q8_0.gguf"], None, "a-Q4_K_M.gguf"),  # default order: Q4_K_M first
    (["a-Q4_1.gguf", "a-Q8_0.gguf"], None, "a-Q8_0.gguf"),             # then Q8_0
    (["README.md", "a-F16.gguf", "b-Q4_1.gguf"], None, "a-F16.gguf"),   # then the first GGUF model
    (["mmproj-a-Q4_1.gguf", "a-Q4_1.gguf"], "Q4_1", "a-Q4_1.gguf"),   # side files are no model
    (["a-Q4_K_M-00002-of-00002.gguf", "a-Q4_K_M-00001-of-00002.gguf"], "Q4_K_M", "a-Q4_K_M-00001-of-00002.gguf"),
    (["sub/dir/a.Q4_0.gguf"], "Q4_0", "sub/dir/a.Q4_0.gguf"),          # '.' after the tag counts too
])
def test_quant_pick_follows_llama_cpp(files, tag, want):
    assert pick_file(files, tag) == want


def test_quant_pick_errors_list_the_files():
    with pytest.raises(MinferError, match="no GGUF file for quant 'Q5_K'.*a-Q4_1.gguf"):
        pick_file(["a-Q4_1.gguf", "x.txt"], "Q5_K")
    with pytest.raises(MinferError, match="OWNER/REPO"):
        HFRef.parse("just-a-name")
    assert HFRef.parse("o/r:q4_1") == HFRef("o/r", "q4_1")


def test_run_hf_downloads_caches_and_runs_offline(hub_env):
    """The acceptance: -hf REPO:Q4_1 downloads from the stand-in, runs, runs again with the Hub
    stopped, and `minfer list` shows it."""
    hub, env, q41 = hub_env
    argv = ["run", "-hf", f"{REPO}:Q4_1", "-n", "4", "--temp", "0", "hello"]
    first = minfer_cli(argv, env)
    assert first.returncode == 0, first.stderr[-3000:]
    assert first.stdout.strip()
    got = [p for m, p, _ in hub.requests if m == "GET" and p.startswith("/cdn/")]
    assert len(got) == 1  # one file downloaded: the Q4_1 one (not Q8_0, not the projector)
    cached = list(Path(env["HF_HOME"]).rglob("tiny-llama-Q4_1.gguf"))
    assert cached and cached[0].read_bytes() == q41
    hub.stop()
    again = minfer_cli(argv, env)
    assert again.returncode == 0, again.stderr[-3000:]
    assert again.stdout == first.stdout  # greedy: the same text, from the cached file
    listed = minfer_cli(["list"], env)
    assert listed.returncode == 0 and f"{REPO}/tiny-llama-Q4_1.gguf" in listed.stdout
    assert "mmproj" not in listed.stdout


def test_pull_rm_and_hf_file(hub_env):
    hub, env, _ = hub_env
    pulled = minfer_cli(["pull", REPO, "-hff", "TINY-LLAMA-Q8_0.gguf"], env, timeout=60)
    assert pulled.returncode == 0, pulled.stderr
    assert pulled.stdout.split()[0].endswith("tiny-llama-Q8_0.gguf")
    default = minfer_cli(["pull", REPO], env, timeout=60)  # no :QUANT: Q8_0 before the first file
    assert default.returncode == 0 and "tiny-llama-Q8_0.gguf" in default.stdout
    minfer_cli(["pull", f"{REPO}:q4_1"], env, timeout=60)
    listed = minfer_cli(["list", "--json"], env, timeout=60)
    import json

    names = {m["name"] for m in json.loads(listed.stdout)}
    assert names == {f"{REPO}/tiny-llama-Q4_1.gguf", f"{REPO}/tiny-llama-Q8_0.gguf"}
    rm = minfer_cli(["rm", f"{REPO}:Q8_0"], env, timeout=60)
    assert rm.returncode == 0 and "tiny-llama-Q8_0.gguf" in rm.stdout
    names = {m["name"] for m in json.loads(minfer_cli(["list", "--json"], env, timeout=60).stdout)}
    assert names == {f"{REPO}/tiny-llama-Q4_1.gguf"}
    assert minfer_cli(["rm", REPO], env, timeout=60).returncode == 0
    assert json.loads(minfer_cli(["list", "--json"], env, timeout=60).stdout) == []
    missing = minfer_cli(["rm", REPO], env, timeout=60)
    assert missing.returncode == 2 and "not in the cache" in missing.stderr
    nofile = minfer_cli(["pull", f"{REPO}:Q5_K_M"], env, timeout=60)
    assert nofile.returncode == 2 and "no GGUF file for quant 'Q5_K_M'" in nofile.stderr
    norepo = minfer_cli(["pull", "someone/nothing-here"], env, timeout=60)
    assert norepo.returncode == 2 and "no model repository someone/nothing-here" in norepo.stderr


def test_interrupted_download_resumes(stand_in_hub, tmp_path):
    """A connection dropped halfway through a file: the download goes on from where it stopped
    (a Range request), and the file is whole. (24 MB: huggingface_hub writes in 10 MB chunks.)"""
    blob = os.urandom(24 << 20)
    hub = stand_in_hub({REPO: {"big-Q4_0.gguf": blob}})
    env = {"HF_ENDPOINT": hub.url, "HF_HOME": str(tmp_path / "hf"), "MINFER_CACHE": str(tmp_path / "minfer")}
    hub.cut_next = True  # the first content GET drops halfway
    pulled = minfer_cli(["pull", f"{REPO}:Q4_0"], env, timeout=90)
    assert pulled.returncode == 0, pulled.stderr[-3000:]
    assert Path(pulled.stdout.split()[0]).read_bytes() == blob
    ranges = [r for m, p, r in hub.requests if m == "GET" and p.startswith("/cdn/")]
    assert len(ranges) == 2 and ranges[0] is None, ranges
    start = int(ranges[1].removeprefix("bytes=").rstrip("-"))
    assert 0 < start <= len(blob) // 2  # resumed, not started over


def test_model_url_downloads_once_then_runs_offline(hub_env):
    hub, env, q41 = hub_env
    url = f"{hub.url}/files/tiny-llama-Q4_1.gguf"
    first = minfer_cli(["run", "-m", url, "-n", "3", "--temp", "0", "hi"], env)
    assert first.returncode == 0, first.stderr[-3000:]
    hub.stop()
    again = minfer_cli(["run", "-mu", url, "-n", "3", "--temp", "0", "hi"], env)
    assert again.returncode == 0 and again.stdout == first.stdout, again.stderr[-3000:]
    assert [p for m, p, _ in hub.requests if m == "GET"] == ["/files/tiny-llama-Q4_1.gguf"]
    listed = minfer_cli(["list"], env, timeout=60)
    assert url in listed.stdout
    bad = minfer_cli(["run", "-m", f"{hub.url}/files/README.md", "-n", "2", "hi"], env, timeout=60)
    assert bad.returncode == 2 and "names a .gguf file" in bad.stderr


def test_source_flags_are_checked_before_anything_loads(run_cli, tmp_path):
    rc, _, err = run_cli(["run", "-m", str(tmp_path / "x.gguf"), "-hf", "o/r", "hi"])
    assert rc == 2 and "give the model once" in err
    rc, _, err = run_cli(["run", "-hff", "x.gguf", "hi"])
    assert rc == 2 and "give -hf OWNER/REPO too" in err
    rc, _, err = run_cli(["run", "-hf", "not a repo", "hi"])
    assert rc == 2 and "OWNER/REPO[:QUANT]" in err
