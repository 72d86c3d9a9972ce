"""Engine: one loaded model on one backend — graph, prepared weights, KV cache slots, trace.

The engine runs steps: `prefill` (a sequence's prompt, in chunks of n_batch tokens) and
`decode` (one token). Both go through `step`, which brackets the backend's forward with the
trace recorder when MINFER_TRACE / EngineConfig.trace_path asks for one. Generation loops and
text handling live in generate.py; this file knows tokens only.
"""

from __future__ import annotations

import torch

from ..backends.base import Batch, create_backend
from ..config import EngineConfig
from ..errors import ContextOverflowError, MinferError
from ..gguf.reader import GGUFReader
from ..graph.passes import optimize
from ..models import registry

DEFAULT_N_CTX = 4096  # context when the caller does not choose one (capped by the training context)
DEFAULT_N_BATCH = 512  # prefill chunk: bounds activation memory of long prompts


class Engine:
    def __init__(self, reader: GGUFReader, *, config: EngineConfig | None = None, n_ctx: int | None = None,
                 n_slots: int = 1, n_batch: int = DEFAULT_N_BATCH, progress: bool = True, token_text=None):
        """`token_text(id) -> str` labels tokens in traces (optional)."""
        self.config = config or EngineConfig.from_env()
        self.args, graph = registry.build(reader)
        self.graph = optimize(graph)
        self.n_vocab = self.args.n_vocab
        self.n_ctx = int(n_ctx or min(self.args.n_ctx_train, DEFAULT_N_CTX))
        if self.n_ctx < 1 or n_batch < 1:
            raise MinferError(f"n_ctx ({self.n_ctx}) and n_batch ({n_batch}) must be >= 1")
        self.n_batch = n_batch
        self.backend = create_backend(self.config.device, self.config)
        self.backend.load(self.graph, reader, progress=progress)
        self.cache = self.backend.new_cache(n_slots, self.n_ctx)
        self.recorder = None
        self._step = 0
        if self.config.trace_path:
            from ..trace.recorder import TraceRecorder

            info = {"path": str(reader.path), "arch": self.args.arch, "n_layer": self.args.n_layer,
                    "n_embd": self.args.n_embd, "n_vocab": self.n_vocab, "device": self.backend.name}
            self.recorder = TraceRecorder(self.config.trace_path, model_info=info, detokenize=token_text)
            self.recorder.set_graph(self.backend.trace_graph())
        self._token_text = token_text

    # ------------------------------------------------------------------ steps
    def check_tokens(self, tokens: list[int], start: int = 0) -> None:
        """Typed errors for ids outside the vocabulary or positions past the context."""
        bad = [t for t in tokens if not isinstance(t, int) or not 0 <= t < self.n_vocab]
        if bad:
            raise MinferError(f"token ids {bad[:5]} are outside the vocabulary [0, {self.n_vocab})")
        if start + len(tokens) > self.n_ctx:
            raise ContextOverflowError(f"{start + len(tokens)} tokens do not fit the context of {self.n_ctx} "
                                       "(load the model with a larger n_ctx, or shorten the input)")

    def step(self, batch: Batch, kind: str) -> torch.Tensor:
        """Run one batch; logits [R, n_vocab]. With a recorder, the step stays open for `finish`."""
        if self.recorder is not None:
            self.recorder.begin_step(self._step, kind, batch.n_tokens)
            self._step += 1
        return self.backend.forward(batch, self.cache, self.recorder)

    def finish(self, token: int | None, logits: torch.Tensor | None) -> None:
        """Close the traced step with the token chosen from it (no-op without a recorder)."""
        if self.recorder is not None:
            text = self._token_text(token) if (token is not None and self._token_text) else ""
            self.recorder.end_step(token, logits, text)

    def prefill(self, slot: int, tokens: list[int], start: int = 0,
                rows: range | None = None) -> torch.Tensor:
        """Feed a sequence's tokens at positions start..; logits [len(rows), V] of the token indices
        in `rows` (default: the last token only). Runs in chunks of n_batch tokens; the trace step
        of the last chunk stays open for `finish`."""
        if not tokens:
            raise MinferError("prefill needs at least one token")
        rows = range(len(tokens) - 1, len(tokens)) if rows is None else rows
        if rows.step != 1 or (len(rows) and not 0 <= rows.start < rows.stop <= len(tokens)):
            raise MinferError(f"logit rows {rows} are not a contiguous range inside 0..{len(tokens)}")
        self.check_tokens(tokens, start)
        outs = []
        for off in range(0, len(tokens), self.n_batch):
            chunk = tokens[off:off + self.n_batch]
            want = range(max(rows.start, off) - off, min(rows.stop, off + len(chunk)) - off)
            logits = self.step(Batch.single(chunk, start + off, slot, want), "prefill")
            if len(want):
                outs.append(logits)
            if off + len(chunk) < len(tokens):
                self.finish(None, None)
        return torch.cat(outs) if outs else torch.empty(0, self.n_vocab)

    def decode(self, slot: int, token: int, pos: int) -> torch.Tensor:
        """Feed one token at `pos`; its logits [n_vocab]."""
        self.check_tokens([token], pos)
        return self.step(Batch.single([token], pos, slot), "decode")[0]

    def close(self) -> None:
        """Write the trace, if any. Idempotent."""
        if self.recorder is not None:
            self.recorder.close()
