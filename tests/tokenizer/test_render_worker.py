"""The chat-template backstop (minfer/tokenizer/render_worker.py): renders in a child process under
RLIMIT_AS and RLIMIT_CPU. Same text as in-process for real templates; the hostile corpus refused
there too; and with the sandbox's own guards removed (a plain jinja2 child), the kernel's limits
and the parent's deadline still end every runaway render as a TemplateError, and the worker
serves the next request."""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest

from minfer.errors import TemplateError
from minfer.gguf.reader import GGUFReader
from minfer.tokenizer import render_chat
from minfer.tokenizer.render_worker import RenderWorker

from .family_templates import CONVERSATION, FAMILIES, TOOLS
from .test_chat_hostile import HOSTILE, MSGS

HERE = Path(__file__).resolve().parent


@pytest.fixture(scope="module")
def worker():
    with RenderWorker() as w:
        yield w


@pytest.fixture(scope="module")
def unguarded():
    with RenderWorker(child="unguarded_worker:main", path=str(HERE)) as w:
        yield w


def test_real_templates_render_the_same_in_the_worker(worker, smollm2_path):
    with GGUFReader(smollm2_path) as r:
        smol = r.metadata["tokenizer.chat_template"]
    for name, src in {"smollm2": smol, **FAMILIES}.items():
        conv = CONVERSATION if name not in ("gemma", "mistral") else CONVERSATION
        for kw in ({}, {"tools": TOOLS}, {"add_generation_prompt": False}):
            want = render_chat(src, conv, bos_token="<s>", eos_token="</s>", **kw)
            assert worker.render(src, conv, bos_token="<s>", eos_token="</s>", **kw) == want, (name, kw)


def test_worker_process_runs_under_kernel_limits(worker):
    worker.render(None, MSGS)
    limits = Path(f"/proc/{worker.pid}/limits").read_text()
    cpu = re.search(r"^Max cpu time\s+(\S+)", limits, re.M).group(1)
    mem = re.search(r"^Max address space\s+(\S+)", limits, re.M).group(1)
    assert cpu != "unlimited" and mem != "unlimited", limits
    assert int(mem) < 4 << 30


def test_hostile_corpus_is_refused_in_the_worker_too(worker, tmp_path):
    for name in sorted(HOSTILE):
        marker = tmp_path / "pwned"
        t0 = time.perf_counter()
        with pytest.raises(TemplateError):
            worker.render(HOSTILE[name].replace("MARKER", str(marker)), MSGS)
        assert time.perf_counter() - t0 < 10, name
        assert not marker.exists(), name
    assert worker.render(None, MSGS).startswith("<|im_start|>user")


@pytest.mark.parametrize("name,source,why", [
    ("memory", "{{ 'a' * 10**10 }}", "out of memory|memory"),
    ("format_memory", "{{ ('{:>1000000}' * 10000).format(*range(10000)) }}", "memory"),
    ("map_center_memory", "{{ range(3000)|map('string')|map('center', 1000000)|list|length }}", "memory"),
    ("cpu", "{% for i in range(99999) %}{% for j in range(99999) %}{% endfor %}{% endfor %}",
     "did not finish|CPU limit"),
    # one C call the interpreter cannot interrupt: 3 ** 30_000_000 is ~23 CPU-s here (2026-12-03), 6 MB; the
    # earlier 3 ** 9_000_000 (3.5 s) finished under the 3 s limit on a faster CI machine
    ("cpu_c_loop", "{{ (10 ** 200000) % 7 ~ (7 ** 300000) % 11 ~ (3 ** 30000000) % 5 }}", "did not finish|CPU"),
])
def test_kernel_limits_hold_without_the_guards(unguarded, name, source, why):
    t0 = time.perf_counter()
    with pytest.raises(TemplateError, match=why):
        unguarded.render(source, MSGS)
    assert time.perf_counter() - t0 < 10
    assert unguarded.render("{{ messages[0].content }}", MSGS) == "hi"  # a fresh child serves the next one


def test_arguments_must_be_json(worker):
    with pytest.raises(TemplateError, match="JSON values"):
        worker.render(None, [{"role": "user", "content": object()}])
    with pytest.raises(TemplateError, match="JSON values"):
        worker.render(None, MSGS, x=float("nan"))


def test_a_killed_worker_is_replaced(worker):
    import os
    import signal

    worker.render(None, MSGS)
    os.kill(worker.pid, signal.SIGKILL)
    time.sleep(0.1)
    assert worker.render("{{ messages|length }}", MSGS) == "1"
