"""`minfer batch IN.jsonl OUT.jsonl`: offline generation for many requests, decoded together.

Each input line is one JSON object: `prompt` (a string) or `messages` (a chat), an optional
`id` (echoed back), and any sampling field of SamplingParams (max_tokens, temperature, top_k,
top_p, min_p, repeat_penalty, repeat_last_n, frequency_penalty, presence_penalty, seed, stop,
ignore_eos); fields a line leaves out take the command's flags. Each output line is the result
of the input line with the same `index`, in input order: text, token_ids, finish_reason and
counts, or `error` {type, message} for a line that could not run (the others go on). Requests
are read and queued as slots free up, so an input of any length streams through.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import sys
import time
from pathlib import Path

from ..engine.params import SamplingParams, check_request
from ..errors import MinferError
from . import common

MAX_LINE_BYTES = 4 << 20
_FIELDS = set(SamplingParams.names())


def add_parser(sub) -> None:
    p = sub.add_parser("batch", help="generate for every request of a JSONL file, many at once",
                       description=__doc__.split("\n\n", 1)[1], formatter_class=argparse.RawDescriptionHelpFormatter)
    common.add_model_args(p, slots=True)
    common.add_sampling_args(p, n_predict=256)
    common.add_chat_args(p, system=False)
    p.add_argument("input", type=Path, help="requests, one JSON object per line ('-': stdin)")
    p.add_argument("output", type=Path, help="results, one JSON object per line ('-': stdout)")
    p.set_defaults(func=batch)


def read_line(line: str) -> dict:
    """One line's JSON object; MinferError saying what is wrong."""
    if len(line.encode("utf-8", "surrogateescape")) > MAX_LINE_BYTES:
        raise MinferError(f"the line is longer than {MAX_LINE_BYTES} bytes")
    try:
        req = json.loads(line)
    except json.JSONDecodeError as e:
        raise MinferError(f"not valid JSON: {e.msg} at column {e.colno}") from None
    if not isinstance(req, dict):
        raise MinferError(f"a request is a JSON object, got {type(req).__name__}")
    return req


def parse_request(req: dict, defaults: SamplingParams):
    """(prompt or messages, params) of one request object; MinferError saying what is wrong. The
    bounds are the server's (engine.params.check_request): max_tokens >= 1, temperature <= 2."""
    unknown = sorted(set(req) - _FIELDS - {"prompt", "messages", "id"})
    if unknown:
        raise MinferError(f"unknown field {unknown[0]!r}; a request has prompt or messages, id, and sampling fields")
    if ("prompt" in req) == ("messages" in req):
        raise MinferError("a request has exactly one of 'prompt' (a string) or 'messages' (a list)")
    prompt = req.get("prompt", req.get("messages"))
    if not isinstance(prompt, str | list):
        raise MinferError("'prompt' must be a string and 'messages' a list of {role, content}")
    fields = {k: v for k, v in req.items() if k in _FIELDS}
    if isinstance(fields.get("stop"), list):
        fields["stop"] = tuple(fields["stop"])
    return prompt, check_request(dataclasses.replace(defaults, **fields))


def _open_in(path: Path):
    if str(path) == "-":
        return sys.stdin
    try:
        return path.open(encoding="utf-8", errors="surrogateescape")
    except OSError as e:
        raise MinferError(f"cannot read {path}: {e.strerror or e}") from None


def _check_not_input(out: Path, inp: Path) -> None:
    """Refuse an output that is the input file (by name, link or hard link): opening it for
    writing would empty the requests before one was read."""
    if "-" in (str(out), str(inp)):
        return
    try:
        same = out.samefile(inp)
    except OSError:  # the output does not exist yet (or cannot be looked at: opening it says why)
        same = False
    if same:
        raise MinferError(f"the output {out} is the input file: writing it would erase the requests; "
                          "give another OUT.jsonl")


def _open_out(path: Path):
    if str(path) == "-":
        return sys.stdout
    try:
        return path.open("w", encoding="utf-8")
    except OSError as e:
        raise MinferError(f"cannot write {path}: {e.strerror or e}") from None


def batch(a: argparse.Namespace) -> int:
    from ..api import result_of
    from ..progress import bar as progress_bar

    defaults = common.sampling(a)
    config = common.engine_config(a)
    if common.follower(a, config):
        return 0
    template = common.read_template(a.chat_template)
    _check_not_input(a.output, a.input)
    src = _open_in(a.input)
    m = common.load_model(a, config, chat_template=template)
    out = _open_out(a.output)
    pending: dict[int, dict | object] = {}  # index -> finished record, or the running sequence
    next_write = 0
    n_read = n_err = n_tokens = 0
    lines = iter(src)
    t0 = time.perf_counter()
    bar = progress_bar(desc="batch", unit="req", leave=False)

    def record(i: int, rid, **fields) -> dict:
        rec = {"index": i}
        if rid is not None:
            rec["id"] = rid
        rec.update(fields)
        return rec

    def write_ready(i: int) -> int:
        """Write the finished records from index i on, in order; the first index not yet written.
        Flushed each time, so closing the file has nothing left to write."""
        try:
            while i in pending and isinstance(pending[i], dict):
                out.write(json.dumps(pending.pop(i), ensure_ascii=False) + "\n")
                i += 1
            out.flush()
        except OSError as e:  # a full disk, a closed pipe
            raise MinferError(f"cannot write {a.output}: {e.strerror or e}") from None
        return i

    def fill() -> bool:
        """Read lines until n_slots requests wait or the input ends; False at the end."""
        nonlocal n_read, n_err
        while len(m.engine.scheduler.waiting) < m.n_slots:
            line = next(lines, None)
            if line is None:
                return False
            i = n_read
            n_read += 1
            if not line.strip():
                pending[i] = record(i, None, error={"type": "MinferError", "message": "empty line"})
                n_err += 1
                continue
            rid = None
            try:
                req = read_line(line)
                rid = req.get("id")
                prompt, params = parse_request(req, defaults)
                with common.flag_errors():
                    seq = m.submit(prompt, params)
                pending[i] = (seq, rid)
            except MinferError as e:
                pending[i] = record(i, rid, error={"type": type(e).__name__, "message": str(e)})
                n_err += 1
        return True

    try:
        more = fill()
        while True:
            n_tokens += len(m.engine.step())
            for i, item in list(pending.items()):
                if isinstance(item, tuple) and item[0].finished:
                    r = result_of(item[0])
                    pending[i] = record(i, item[1], text=r.text, token_ids=r.token_ids, finish_reason=r.finish_reason,
                                        prompt_tokens=r.prompt_tokens, completion_tokens=r.completion_tokens,
                                        cached_tokens=r.cached_tokens, seconds=round(r.seconds, 4))
                    bar.update(1)
            next_write = write_ready(next_write)
            dt = time.perf_counter() - t0
            bar.set_postfix_str(f"{n_tokens / dt:.1f} tok/s" if dt > 0 else "")
            if more:
                more = fill()
            if not more and not m.engine.scheduler.has_work():
                break
        write_ready(next_write)
    finally:
        bar.close()
        if out is not sys.stdout:
            with contextlib.suppress(OSError):  # (only what a failed write left: that error is raised)
                out.close()
        common.close_model(m, config)
    dt = time.perf_counter() - t0
    print(f"minfer batch: {n_read} requests ({n_err} errors), {n_tokens} tokens generated in {dt:.1f} s "
          f"({n_tokens / dt if dt > 0 else 0.0:.1f} tok/s)", file=sys.stderr)
    return 0
