"""OpenAI's response shapes for one request (chat or completion), streamed or whole, with its n
choices and, for a chat with tools, each choice's output read as content and tool calls
(tools.py's ToolStream).

Each choice is fed what its sequence produced ("delta" events: text, token ids, logprobs); a
choice that parses tool calls feeds its text (stop strings applied, control tokens not shown, as
any answer's) to its ToolStream. Chunks of a stream carry the
choice's `index`; a choice's completed tool calls go out as one delta each (OpenAI's
`tool_calls` delta with index, id, type, name and the whole arguments); its finish reason is
`tool_calls` when it made any.
"""

from __future__ import annotations

import time
import uuid

from .tools import ToolStream


class Choice:
    """One choice's accumulated text, reported logprobs and (tools) parser state."""

    def __init__(self, index: int, tools: ToolStream | None):
        self.index = index
        self.text: list[str] = []
        self.lps: list[tuple] = []  # (token id, logprob, top list) of reported tokens
        self.offset = 0  # characters so far (completion logprobs' text_offset)
        self.tools = tools
        self.calls: list[dict] = []


class Output:
    def __init__(self, kind: str, model_id: str, tokenizer, eog_ids, ignore_eos: bool, n: int = 1,
                 tools: tuple[str, str | None] | None = None):
        """`tools`: (mode, named function) for tools.ToolStream, or None when tool calls are not parsed."""
        self.kind, self.model = kind, model_id
        self.tok, self.eog, self.ignore_eos = tokenizer, eog_ids, ignore_eos
        self.id = ("chatcmpl-" if kind == "chat" else "cmpl-") + uuid.uuid4().hex
        self.created = int(time.time())
        self.choices = [Choice(i, ToolStream(*tools) if tools else None) for i in range(n)]
        self.with_logprobs = False
        self.echo = ""  # completions with echo: the prompt's text, before the generated text

    # --- accumulation
    def _reported(self, tokens, lps) -> list[tuple]:
        if lps is None:
            return []
        self.with_logprobs = True
        return [(t, lp, top) for t, (lp, top) in zip(tokens, lps, strict=True)
                if self.ignore_eos or t not in self.eog]

    def _read(self, c: Choice, text: str, end: bool = False) -> tuple[str, list[dict]]:
        """(content, completed calls) of new output; without tools, the text as it is."""
        if c.tools is None:
            return text, []
        content, calls = c.tools.feed(text)
        if end:
            rest, last = c.tools.finish()
            content, calls = content + rest, calls + last
        c.calls += calls
        return content, calls

    def add(self, index: int, text: str, tokens, lps) -> None:
        c = self.choices[index]
        content, _ = self._read(c, text)
        c.text.append(content)
        c.lps += self._reported(tokens, lps)

    def end(self, index: int) -> tuple[str, list[dict]]:
        """What the choice's parser still held when it finished (content, calls)."""
        c = self.choices[index]
        if c.tools is None:
            return "", []
        content, calls = self._read(c, "", end=True)
        c.text.append(content)
        return content, calls

    def reason(self, index: int, finish_reason: str) -> str:
        return "tool_calls" if self.choices[index].calls else finish_reason

    # --- logprobs shapes
    def _piece(self, t: int) -> bytes:
        return self.tok.token_to_piece(t, special=True)

    def _logprobs(self, c: Choice, items: list[tuple]) -> dict | None:
        if not self.with_logprobs:
            return None
        if self.kind == "chat":
            def one(t, lp):
                b = self._piece(t)
                return {"token": b.decode("utf-8", "replace"), "logprob": lp, "bytes": list(b)}
            return {"content": [{**one(t, lp), "top_logprobs": [one(i, v) for i, v in top]} for t, lp, top in items]}
        tokens, offsets = [], []
        for t, _, _ in items:
            s = self._piece(t).decode("utf-8", "replace")
            tokens.append(s)
            offsets.append(c.offset)
            c.offset += len(s)
        return {"tokens": tokens, "token_logprobs": [lp for _, lp, _ in items],
                "top_logprobs": [{self._piece(i).decode("utf-8", "replace"): v for i, v in top} for _, _, top in items],
                "text_offset": offsets}

    # --- whole answers
    def whole(self, finish_reasons: list[str], usage: dict) -> dict:
        choices = []
        for c, why in zip(self.choices, finish_reasons, strict=True):
            text = self.echo + "".join(c.text)
            lps = self._logprobs(c, c.lps)
            if self.kind == "chat":
                message = {"role": "assistant", "content": text if text or not c.calls else None}
                if c.calls:
                    message["tool_calls"] = c.calls
                choices.append({"index": c.index, "message": message, "logprobs": lps,
                                "finish_reason": self.reason(c.index, why)})
            else:
                choices.append({"index": c.index, "text": text, "logprobs": lps, "finish_reason": why})
        obj = "chat.completion" if self.kind == "chat" else "text_completion"
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model, "choices": choices,
                "usage": usage_json(usage)}

    # --- stream chunks
    def _chunk(self, choice: dict | None, usage: bool) -> dict:
        obj = "chat.completion.chunk" if self.kind == "chat" else "text_completion"
        out = {"id": self.id, "object": obj, "created": self.created, "model": self.model,
               "choices": [choice] if choice is not None else []}
        if usage:
            out["usage"] = None
        return out

    def first_chunks(self, usage: bool) -> list[dict]:
        if self.kind == "chat":
            return [self._chunk({"index": c.index, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                                 "finish_reason": None}, usage) for c in self.choices]
        return [self._chunk({"index": c.index, "text": self.echo, "logprobs": None, "finish_reason": None}, usage)
                for c in self.choices]

    def _calls_chunks(self, c: Choice, calls: list[dict], usage: bool) -> list[dict]:
        first = len(c.calls) - len(calls)
        return [self._chunk({"index": c.index, "delta": {"tool_calls": [{"index": first + k, **call}]},
                             "logprobs": None, "finish_reason": None}, usage) for k, call in enumerate(calls)]

    def delta_chunks(self, index: int, text: str, tokens, lps, usage: bool) -> list[dict]:
        c = self.choices[index]
        content, calls = self._read(c, text)
        items = self._reported(tokens, lps)
        out = []
        if content or items:
            lp = self._logprobs(c, items)
            if self.kind == "chat":
                out.append(self._chunk({"index": index, "delta": {"content": content}, "logprobs": lp,
                                        "finish_reason": None}, usage))
            else:
                out.append(self._chunk({"index": index, "text": content, "logprobs": lp, "finish_reason": None},
                                       usage))
        return out + self._calls_chunks(c, calls, usage)

    def final_chunks(self, index: int, finish_reason: str, usage: bool) -> list[dict]:
        c = self.choices[index]
        out = []
        if c.tools is not None:
            content, calls = self._read(c, "", end=True)
            if content:
                out.append(self._chunk({"index": index, "delta": {"content": content}, "logprobs": None,
                                        "finish_reason": None}, usage))
            out += self._calls_chunks(c, calls, usage)
        why = self.reason(index, finish_reason)
        if self.kind == "chat":
            return out + [self._chunk({"index": index, "delta": {}, "logprobs": None, "finish_reason": why}, usage)]
        return out + [self._chunk({"index": index, "text": "", "logprobs": None, "finish_reason": why}, usage)]

    def usage_chunk(self, usage: dict) -> dict:
        out = self._chunk(None, False)
        out["usage"] = usage_json(usage)
        out["timings"] = timings_json(usage)
        return out


def usage_json(u: dict) -> dict:
    return {"prompt_tokens": u["prompt_tokens"], "completion_tokens": u["completion_tokens"],
            "total_tokens": u["total_tokens"], "prompt_tokens_details": {"cached_tokens": u["cached_tokens"]}}


def timings_json(u: dict) -> dict:
    """llama-server's `timings` (the last chunk of a stream that asks for usage): the prompt tokens
    actually run (prompt_n; cache_n came from a slot's cache) and their time, the generated tokens
    (predicted_n) and the decode steps' time; rates per second where there is a time (the first
    generated token comes from the prefill: predicted_ms covers predicted_n - 1 steps); with speculative
    decoding, the draft tokens proposed and accepted (draft_n, draft_n_accepted)."""
    prompt_n = u["prompt_tokens"] - u["cached_tokens"]
    prompt_ms, predicted_ms = u["prefill_seconds"] * 1e3, u["decode_seconds"] * 1e3
    steps = u["completion_tokens"] - 1
    return {"cache_n": u["cached_tokens"], "prompt_n": prompt_n, "prompt_ms": prompt_ms,
            "prompt_per_second": prompt_n / prompt_ms * 1e3 if prompt_ms > 0 else 0.0,
            "predicted_n": u["completion_tokens"], "predicted_ms": predicted_ms,
            "predicted_per_second": steps / predicted_ms * 1e3 if steps > 0 and predicted_ms > 0 else 0.0,
            **({"draft_n": u["draft_tokens"], "draft_n_accepted": u["draft_accepted"]} if u.get("draft_tokens")
               else {})}


def merged_usage(usages: list[dict]) -> dict:
    """The usage of n choices sharing one prompt: the prompt once, every choice's completion (the
    timings: the first choice's prefill, the longest decode)."""
    prompt = usages[0]["prompt_tokens"]
    completion = sum(u["completion_tokens"] for u in usages)
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion,
            "cached_tokens": usages[0]["cached_tokens"], "prefill_seconds": usages[0]["prefill_seconds"],
            "decode_seconds": max(u["decode_seconds"] for u in usages),
            "draft_tokens": sum(u.get("draft_tokens", 0) for u in usages),
            "draft_accepted": sum(u.get("draft_accepted", 0) for u in usages)}
