"""The engine: one loaded model on one backend, and the loop that steps many sequences at once.

    engine = Engine.load(reader, config, tokenizer=tok)
    seq = engine.add(prompt_ids, SamplingParams(max_tokens=32))
    for piece in engine.stream(seq): ...        # or engine.run([seq, ...])

`step()` is the whole runtime: the scheduler forms one batch (every generating sequence's next
token and at most one prompt chunk), the backend runs it, the scheduler hands each sequence its
logits row to sample from. One sequence or a hundred take the same path.

Overlap (a backend with `decode_pick`, EngineConfig.overlap): when every sequence of a decode
step picks its token from its logits alone (greedy, or sampling without penalties from at most
64 candidates; no logprobs), the backend picks the tokens on the device, and before reading them
the engine queues the next step, whose input tokens the device takes from the step before. The
host's work on step N (reading its tokens, stop strings, text) then runs while the GPU computes
step N+1, and the GPU does not wait for the host between steps. At most one step is in flight
after `step()` returns; it is read by the next call. A sequence that ends by an end token or a
stop string has run one speculative row past its end, which changes nothing it returns.
The cpu backend picks in the backend too (greedy rows inside its decode program, where the logits
are still in the threads' caches) but queues nothing ahead (`queues_ahead`): on the host there is
nothing to overlap, and a step ahead would only hold each token back by one step.
A sequence with a grammar overlaps the same way on a backend with `masked_pick` (cuda): step N+1's
forward is queued before step N's tokens are read; once they are, the grammars advance, the
masks of step N+1 are computed on the host while its forward runs on the device, and its pick
is queued behind them (engine/masks.py computes them, the backend applies them before its pick).
Elsewhere (and with a logit bias) the host samples: the step's masks are computed while the
backend runs the forward, then applied to the logits before the sampler sees them. With a trace recorder
(MINFER_TRACE / EngineConfig.trace_path) each step is recorded node by node, with one token per
sequence.
"""

from __future__ import annotations

import contextlib
import itertools
import numbers
from collections.abc import Iterable, Iterator

import torch

from ..backends import Backend
from ..backends.kv_cache import kv_bytes
from ..config import EngineConfig
from ..errors import ContextOverflowError, MinferError
from ..gguf.reader import GGUFReader
from ..kernels.sample import pack_params
from . import loader, tp
from .draft import DraftBudget, ModelDrafter, NgramDrafter, load_draft_model
from .grammar import Matcher
from .masks import Masks
from .params import SamplingParams
from .pooling import check_pooling
from .pooling import rows_of as pooling_rows
from .scheduler import Scheduler
from .sequence import Sequence, TextStream

DEFAULT_N_CTX = 4096  # context when the caller does not choose one (capped by the training context)
AUTO_SLOTS = 4  # sequences in flight when the caller does not choose (fewer if the KV budget is smaller)


def check_tokens(tokens: list[int], n_vocab: int, n_ctx: int) -> None:
    """Typed errors for an empty prompt, ids outside [0, n_vocab), or a prompt past n_ctx tokens."""
    if not tokens:
        raise MinferError("the prompt is empty: nothing to generate from")
    bad = [t for t in tokens if isinstance(t, bool) or not isinstance(t, int) or not 0 <= t < n_vocab]
    if bad:
        raise MinferError(f"token ids {bad[:5]} are outside the vocabulary [0, {n_vocab})")
    if len(tokens) > n_ctx:
        raise ContextOverflowError(f"the prompt has {len(tokens)} tokens but the context holds {n_ctx} "
                                   "(load the model with a larger context: n_ctx, or -c/--ctx-size on the command "
                                   "line; or shorten the input)")


class Engine:
    def __init__(self, backend: Backend, *, n_vocab: int, n_ctx: int, n_slots: int,
                 config: EngineConfig | None = None, tokenizer=None, recorder=None, args=None, graph=None,
                 weights=None, draft_model: ModelDrafter | None = None):
        """An engine over a backend that is loaded and allocated for n_slots x n_ctx (see `load`).
        `weights`: the file as the backend read it (split over ranks: this rank's part).
        `draft_model`: the drafter of `spec="model"` (speculative decoding; engine/draft.py)."""
        self.config = config or EngineConfig()
        self.draft_model = draft_model
        self.backend = backend
        self.args, self.graph, self.weights = args, graph, weights
        self.n_vocab, self.n_ctx, self.n_slots = n_vocab, n_ctx, n_slots
        self.closed = False  # close() ran: no more requests
        self.tokenizer = tokenizer
        self.eog_ids = frozenset(tokenizer.eot_ids) if tokenizer is not None else frozenset()
        max_batch = self.config.max_batch_tokens or n_slots + self.config.prefill_chunk
        prefill_seqs = self.config.prefill_seqs or backend.prefill_seqs
        # the prefix cache reuses KV blocks across slots by copying them (Backend.copy_kv)
        self.scheduler = Scheduler(n_slots, n_ctx, self.config.prefill_chunk, max_batch, prefill_seqs=prefill_seqs,
                                   prefix_block=self.config.prefix_block,
                                   prefix_cache=self.config.prefix_cache and backend.kv_copy,
                                   argmax=backend.greedy_tokens)
        self.recorder = recorder
        self.steps = 0
        self._ids = itertools.count()
        # steps picked on the device overlap: step N+1 is queued before step N's tokens are read
        self._launch = backend.decode_pick if backend.device_pick and self.config.overlap and recorder is None \
            else None
        self._inflight = None  # (ScheduledStep, the backend's launched step) queued but not read yet
        # grammar masks and logit biases (engine/masks.py); their bitmasks staged in pinned memory for a GPU
        self.masks = Masks(pinned=backend.name == "cuda" and torch.cuda.is_available())

    @classmethod
    def load(cls, reader: GGUFReader, config: EngineConfig | None = None, *, tokenizer=None,
             progress: bool = True, comm=None) -> Engine:
        """Build the model's graph, prepare its weights on the configured backend, allocate the
        KV cache, and (when tracing) open the trace recorder. `comm`: rank 0's communicator of
        a tensor-parallel group (engine/tp.py): this rank's part of the model, on a backend
        that drives the other ranks."""
        config = config or EngineConfig.from_env()
        if comm is None or comm.world == 1:
            m = loader.load(reader, config, comm, progress)
            backend = m.backend
        else:
            loaded = []
            tp.agreed(comm, lambda: loaded.append(loader.load(reader, config, comm, progress)), "loading the model")
            m = loaded[0]
            backend = tp.RankDriver(m.backend, comm)
        args, graph, view = m.args, m.graph, m.view
        n_ctx = config.n_ctx or min(args.n_ctx_train, DEFAULT_N_CTX)
        drafter = None
        try:
            n_slots = config.n_slots or _auto_slots(backend, graph.meta, n_ctx)
            backend.allocate(n_slots, n_ctx)
            if config.spec == "model":
                drafter = load_draft_model(reader, config, n_slots, n_ctx, args.n_vocab, progress)
        except BaseException:
            with contextlib.suppress(Exception):  # the other ranks of a split stop too (a rank gone already:
                backend.close()  # the first error counts)
            raise
        recorder = None
        if config.trace_path:
            from ..trace.recorder import TraceRecorder

            info = {"path": str(reader.path), "arch": args.arch, "n_layer": args.n_layer, "n_embd": args.n_embd,
                    "n_vocab": args.n_vocab, "device": backend.name}
            text = (lambda t: tokenizer.decode([t])) if tokenizer is not None else None
            recorder = TraceRecorder(config.trace_path, model_info=info, detokenize=text)
            recorder.set_graph(backend.trace_graph())
        return cls(backend, n_vocab=args.n_vocab, n_ctx=n_ctx, n_slots=n_slots, config=config, tokenizer=tokenizer,
                   recorder=recorder, args=args, graph=graph, weights=view, draft_model=drafter)

    # ------------------------------------------------------------------ requests
    def check_tokens(self, tokens: list[int], params: SamplingParams | None = None) -> None:
        """Typed errors for an empty prompt, ids outside the vocabulary, or a prompt past the context;
        with `params` of a generation (max_tokens not 0), also a prompt that fills the context: no
        room for a token (the server's and llama-server's rule: prompt + generated <= n_ctx)."""
        check_tokens(tokens, self.n_vocab, self.n_ctx)
        if params is not None and params.max_tokens != 0 and len(tokens) >= self.n_ctx:
            raise ContextOverflowError(f"the prompt has {len(tokens)} tokens and the context holds {self.n_ctx}: "
                                       "no room to generate (load the model with a larger context: n_ctx, or "
                                       "-c/--ctx-size on the command line; or shorten the input)")

    def add(self, prompt: list[int], params: SamplingParams | None = None, *, logit_rows: range | None = None,
            reuse_prefix: bool = True, pooling: str | None = None) -> Sequence:
        """Queue a sequence. `logit_rows`: prompt positions whose logits to keep (a contiguous range);
        `reuse_prefix`: may start from the tokens a free slot holds (chat turns). `pooling`: an
        embedding of the prompt pooled so (engine/pooling.py; `Sequence.embedding()` when finished)."""
        if self.closed:
            raise MinferError("the model is closed (close() released it): load it again to run requests")
        if pooling is not None:
            check_pooling(pooling)
            self.backend.check_hidden()
            params = SamplingParams(max_tokens=0)
            logit_rows, reuse_prefix = pooling_rows(len(prompt), pooling) if prompt else None, False
        prompt = [int(t) if isinstance(t, numbers.Integral) and not isinstance(t, bool) else t for t in prompt]
        params = params or SamplingParams()
        self.check_tokens(prompt, params)
        if logit_rows is not None and (logit_rows.step != 1 or (
                len(logit_rows) and not 0 <= logit_rows.start < logit_rows.stop <= len(prompt))):
            raise MinferError(f"logit rows {logit_rows} are not a contiguous range inside 0..{len(prompt)}")
        text = TextStream(self.tokenizer, params.stop) if self.tokenizer is not None else None
        if text is None and (params.stop or params.grammar is not None):
            raise MinferError("stop strings and grammars need a tokenizer to turn tokens into text")
        bad = [t for t, _ in params.logit_bias if t >= self.n_vocab]
        if bad:
            raise MinferError(f"logit_bias token ids {bad[:5]} are outside the vocabulary [0, {self.n_vocab})")
        matcher = Matcher(params.grammar, self.tokenizer, self.n_vocab) if params.grammar is not None else None
        seq = Sequence(next(self._ids), prompt, params, eog_ids=self.eog_ids, text=text, logit_rows=logit_rows,
                       reuse_prefix=reuse_prefix, matcher=matcher, pooling=pooling)
        c = self.config
        if c.spec and matcher is None and pooling is None:  # (a grammar's mask is one row's)
            seq.drafter = self.draft_model if c.spec == "model" else NgramDrafter(c.draft_ngram_max,
                                                                                   c.draft_ngram_min)
            seq.draft_budget = DraftBudget(c.draft_max)
        self.scheduler.add(seq)
        return seq

    def abort(self, seq: Sequence) -> None:
        """Stop a sequence now; its slot is free for the next step."""
        self.scheduler.abort(seq)

    def reset(self) -> None:
        """Forget the prefixes free slots hold."""
        self.scheduler.forget()

    # ------------------------------------------------------------------ the loop
    def step(self) -> list[tuple[Sequence, int]]:
        """Run one batch; (sequence, token) for every token sampled. Nothing to do: []."""
        if self._inflight is not None:
            plan, launched = self._inflight
            self._inflight = None
        else:
            plan = self.scheduler.schedule()
            if plan is None:
                return []
            for src, dst, n in plan.copies:  # cached prefix blocks into new sequences' slots, before the step
                self.backend.copy_kv(src, dst, n)
            if not self._launchable(plan):
                return self._run(plan)
            launched = self._queue(plan)
            self.steps += 1
        nxt = self.scheduler.continue_decode(plan) if self.backend.queues_ahead else None
        if nxt is not None:  # queued behind `plan` on the device before its tokens are read
            self._inflight = (nxt, self._queue(nxt, after=launched))
            self.steps += 1
        try:
            sampled = [(seq, tok) for seq, tok, _ in self.scheduler.postprocess(plan, picked=launched.tokens())]
        finally:
            if self._inflight is not None:  # the grammars have taken `plan`'s tokens: the next step's masks
                self._pick_masked(*self._inflight)
        if not sampled and self._inflight is None:  # every row of it had ended: run what is next
            return self.step()
        return sampled

    def _launchable(self, plan) -> bool:
        """Whether the backend launches `plan` and picks its tokens on the device (and may queue
        the next step before they are read): a decode step without drafts whose rows pick from
        their logits alone, or also from a grammar's mask where the backend applies one."""
        return self._launch is not None and plan.batch.kind == "decode" and not plan.drafts and \
            all(s.device_pickable for s in plan.decode) and \
            (self.backend.masked_pick or all(s.matcher is None for s in plan.decode))

    def _queue(self, plan, after=None):
        """Launch `plan` (`after`: the launched step before it, whose tokens are its inputs). Rows
        under a grammar are launched masked: their pick waits for `_pick_masked`, here when the
        step before is read already (its tokens are known: the masks are computed while the
        forward runs), else after `step` has read it."""
        params = _sampling(plan.decode, 0 if after is None else 1)
        if all(s.matcher is None for s in plan.decode):
            return self._launch(plan.batch, after=after, params=params)
        launched = self._launch(plan.batch, after=after, params=params, masked=True)
        if after is None:
            self._pick_masked(plan, launched)
        return launched

    def _pick_masked(self, plan, launched) -> None:
        """Queue a masked step's pick with its rows' bitmasks (nothing for a step launched unmasked).
        A sequence that has finished meanwhile gets every token allowed: its row's token is dropped."""
        if getattr(launched, "pending", False):
            matchers = [None if s.finished else s.matcher for s in plan.decode]
            launched.pick(self.masks.rows(matchers, self.n_vocab))

    def _run(self, plan) -> list[tuple[Sequence, int]]:
        """One step the host samples from: the backend's logits, read before the next step."""
        if plan.hidden:  # embedding chunks: their rows' final hidden states, nothing sampled
            self.steps += 1
            self.scheduler.postprocess(plan, self.backend.hidden(plan.batch))
            return []
        rec = self.recorder
        if rec is not None:
            rec.begin_step(self.steps, plan.batch.kind, plan.batch.n_tokens)
        self.steps += 1
        live = [(s, row) for s, row in plan.samples if not s.finished]
        masks = self.masks.begin([(s.matcher, row) for s, row in live if s.matcher is not None], self.n_vocab)
        logits = self.backend.forward(plan.batch, rec)  # (the masks are computed meanwhile)
        if masks is not None or any(s.params.logit_bias for s, _ in live):
            logits = self.masks.finish(masks, logits, [(s.params.logit_bias, row) for s, row in live
                                                       if s.params.logit_bias])
        sampled = self.scheduler.postprocess(plan, logits)
        if rec is not None:
            for seq, tok, row in sampled:
                rec.step_token(seq.id, tok, logits[row], self.tokenizer.decode([tok]) if self.tokenizer else "")
            rec.end_step()
        return [(seq, tok) for seq, tok, _ in sampled]

    def run(self, seqs: Iterable[Sequence] | None = None) -> None:
        """Step until `seqs` (default: every queued sequence) are finished."""
        seqs = list(seqs) if seqs is not None else None
        while (any(not s.finished for s in seqs) if seqs is not None else self.scheduler.has_work()):
            if not self.step() and not self.scheduler.has_work():
                break

    def stream(self, seq: Sequence) -> Iterator[str]:
        """Step until `seq` finishes, yielding its text as it grows. Closing the iterator early
        aborts the sequence (its slot is free at once)."""
        try:
            while not seq.finished:
                self.step()
                piece = seq.take_text()
                if piece:
                    yield piece
            piece = seq.take_text()
            if piece:
                yield piece
        finally:
            if not seq.finished:
                self.abort(seq)

    def warmup(self) -> None:
        """Let the backend compile and capture what the first steps would wait for (a server calls
        this before it says it is ready); nothing for a backend that needs none."""
        self.backend.warmup()

    def close(self) -> None:
        """Write the trace, if any; stop the other ranks of a tensor-parallel group. Idempotent.
        A closed engine takes no more requests (`add`: a MinferError)."""
        self.closed = True
        if self.recorder is not None:
            self.recorder.close()
        self.masks.close()
        if self.draft_model is not None:
            self.draft_model.close()
            self.draft_model = None
        self.backend.close()


def _sampling(seqs: list[Sequence], ahead: int):
    """The rows' packed sampling parameters for a device pick, or None when every row is greedy."""
    if all(s.params.greedy for s in seqs):
        return None
    return pack_params([s.sampling_row(ahead) for s in seqs])


def _auto_slots(backend: Backend, meta: dict, n_ctx: int) -> int:
    """Up to AUTO_SLOTS sequences, as many as the backend's KV-cache budget holds (at least one)."""
    per_slot = kv_bytes(meta["n_layer"], 1, n_ctx, meta["n_head_kv"], meta["head_dim"], backend.kv_itemsize)
    return max(1, min(AUTO_SLOTS, backend.kv_budget() // max(per_slot, 1)))
