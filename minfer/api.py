"""The Python API: `minfer.load(path)` -> a Model you can tokenize with, score and generate from.

    import minfer
    m = minfer.load()                                  # the default SmolLM2 model, on cpu
    ids = m.tokenize("The capital of France is")
    m.logits(ids)                                      # float32 [len(ids), n_vocab]
    m.generate("The capital of France is", max_tokens=16, temperature=0)
    for piece in m.generate([{"role": "user", "content": "Hi!"}], stream=True):
        print(piece, end="")
    m.generate_batch(["Once upon a time", "The sky is"], max_tokens=32)   # decoded together
    m.generate("A person as JSON:", json_schema={"type": "object", ...})  # output parses and validates
    m.embed(["first text", "second text"])             # L2-normalised vectors (pooling: the file's, or mean)

Every call goes through the engine's one loop (engine/engine.py): a Model has n_slots
KV-cache slots (default: up to 4, as memory allows) and runs that many sequences per step;
more wait their turn. A later prompt that starts with tokens a free slot still holds (the next
chat turn) only runs the new part. A Model is not thread-safe: the server drives its own loop.

Tensor parallelism: `minfer.load(path, device="cuda", tp=2)` splits the model over 2 ranks
(processes; one GPU each on cuda, gloo between CPU processes): this process is rank 0 and
starts the other ranks, which follow it until `close()`. Under torchrun (RANK / WORLD_SIZE
set) rank 0 builds the Model and the other ranks call `follow(path, config)`.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import torch

from .config import EngineConfig, dist_env
from .default_model import default_model_path
from .engine.engine import Engine
from .engine.grammar import Grammar
from .engine.params import SamplingParams
from .engine.perplexity import PerplexityResult, perplexity
from .engine.pooling import default_pooling
from .engine.sequence import Sequence
from .engine.stats import GenerationStats
from .errors import MinferError, ParallelError, TemplateError
from .gguf.reader import GGUFReader
from .tokenizer import Tokenizer

Messages = list[dict]
Prompt = str | Messages
ROLES = ("system", "developer", "user", "assistant", "tool")  # a message's roles; developer is rendered as system


def load(path: str | os.PathLike | None = None, device: str = "cpu", *, progress: bool = True,
         trace: str | os.PathLike | None = None, chat_template: str | None = None,
         config: EngineConfig | None = None, **settings) -> Model:
    """Load a GGUF model (default: SmolLM2-135M-Instruct) on `device` ("cpu"; "cuda" needs the cuda
    backend). `settings` are EngineConfig fields: n_ctx (tokens per sequence, default
    min(training context, 4096)), n_slots, prefill_chunk, max_batch_tokens, kv_dtype, threads,
    cuda_graph, overlap, prefill_seqs, mmq, prefix_cache (reuse cached KV blocks of prompt prefixes
    across requests; default on), prefix_block, spec ("ngram": speculative decoding with prompt-lookup
    drafts), draft_max. `trace` records a trace file (as MINFER_TRACE does); `chat_template`
    replaces the file's chat template (Jinja source). A ready `config` replaces device, trace
    and settings."""
    return Model(path, device, progress=progress, trace=trace, chat_template=chat_template, config=config,
                 **settings)


def follow(path: str | os.PathLike, config: EngineConfig) -> None:
    """A rank other than 0 of a torchrun group: load this rank's part of the model and repeat
    rank 0's steps until rank 0 closes its Model. `config` as rank 0's (its tp = the group size)."""
    from .engine.tp import run_follower
    from .parallel.launch import join

    group = join(config, Path(path))
    if group.rank == 0:
        group.close()
        raise ParallelError("follow() is for the ranks other than 0; rank 0 builds a Model")
    run_follower(Path(path), config, group)


@dataclass(frozen=True)
class GenerationResult:
    """One finished request."""

    text: str
    token_ids: list[int]  # generated tokens (an end token included when it ended the sequence)
    finish_reason: str  # "stop" (end token or stop string), "length" (max_tokens / context) or "abort"
    prompt_tokens: int
    cached_tokens: int  # prompt tokens reused from a slot (not run again)
    seconds: float  # from submission to the last token

    @property
    def completion_tokens(self) -> int:
        return len(self.token_ids)


def sampling_params(json_schema: dict | str | None = None, **sampling) -> SamplingParams:
    """SamplingParams from keywords, with `json_schema` (a schema) or `grammar` (GBNF text or a
    Grammar) as the grammar the output must match."""
    grammar = sampling.pop("grammar", None)
    if json_schema is not None and grammar is not None:
        raise MinferError("pass json_schema or grammar, not both")
    if json_schema is not None:
        grammar = Grammar.json_schema(json_schema)
    elif isinstance(grammar, str):
        grammar = Grammar.gbnf(grammar)
    return SamplingParams.of(grammar=grammar, **sampling)


def result_of(seq: Sequence) -> GenerationResult:
    st = seq.stats
    end = st.finished or st.arrival
    return GenerationResult(seq.take_text(), seq.generated, seq.finish_reason or "abort", seq.n_prompt,
                            st.cached_tokens, end - st.arrival)


def chat_messages(messages: Messages) -> Messages:
    """Messages as a chat template reads them, from OpenAI's shapes (what the server takes,
    server/schema.py `messages_of`): content a string, or a list of text parts joined; None only in
    an assistant turn of tool calls (then ""); the developer role is system. TemplateError for what
    the server refuses with a 400. Other keys pass through; the caller's dicts are not changed."""
    if not isinstance(messages, list):
        raise TemplateError("messages must be a list of {'role': ..., 'content': ...} dicts")
    if not messages:
        raise TemplateError("messages must hold at least one message")
    out = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict):
            raise TemplateError(f"messages[{i}] must be a dict (role, content), got {type(m).__name__}")
        role, content = m.get("role"), m.get("content")
        if not isinstance(role, str):
            raise TemplateError(f"messages[{i}].role must be a string, got {role!r}")
        if role not in ROLES:
            raise TemplateError(f"messages[{i}].role {role!r} is not one of {', '.join(ROLES)}")
        if isinstance(content, list):
            texts = []
            for j, part in enumerate(content):
                kind = part.get("type") if isinstance(part, dict) else type(part).__name__
                if kind != "text" or not isinstance(part.get("text"), str):
                    raise TemplateError(f"messages[{i}].content[{j}]: only text parts are supported "
                                        f"(got type {kind!r})")
                texts.append(part["text"])
            content = "".join(texts)
        if content is None and not (role == "assistant" and m.get("tool_calls")):
            raise TemplateError(f"messages[{i}].content is missing")
        if content is not None and not isinstance(content, str):
            raise TemplateError(f"messages[{i}].content must be a string or a list of text parts, "
                                f"got {type(content).__name__}")
        out.append({**m, "role": "system" if role == "developer" else role, "content": content or ""})
    return out


class Prompting:
    """Prompts to token ids with the model's tokenizer and chat template: what needs no weights
    (a Model is one; so is the server's front end, whose engine runs in another process)."""

    tokenizer: Tokenizer

    def tokenize(self, text: str, add_special: bool = True, parse_special: bool = False) -> list[int]:
        return self.tokenizer.encode(text, add_special=add_special, parse_special=parse_special)

    def detokenize(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids)

    def chat_tokens(self, messages: Messages, add_generation_prompt: bool = True,
                    tools: list[dict] | None = None) -> list[int]:
        """Render messages with the model's chat template and tokenize (special tokens parsed).
        A template that already writes BOS does not get a second one. `tools`: OpenAI's tool
        list, for the template's `tools` variable."""
        extra = {"tools": tools} if tools else {}
        text = self.tokenizer.apply_chat_template(chat_messages(messages), add_generation_prompt=add_generation_prompt,
                                                  **extra)
        ids = self.tokenizer.encode(text, add_special=True, parse_special=True)
        bos = self.tokenizer.bos_id
        if len(ids) >= 2 and ids[0] == ids[1] == bos:
            ids = ids[1:]
        return ids

    def infill_ids(self, prefix: str, suffix: str) -> list[int]:
        """llama.cpp's fill-in-the-middle prompt (prefix-suffix-middle): [BOS] FIM_PRE prefix
        FIM_SUF suffix FIM_MID, the texts tokenized without special tokens. MinferError when the
        model has no FIM tokens."""
        tok = self.tokenizer
        pre, suf, mid = (tok.special_id(k) for k in ("fim_pre", "fim_suf", "fim_mid"))
        if None in (pre, suf, mid):
            raise MinferError("this model has no fill-in-the-middle tokens (FIM prefix / suffix / middle)")
        ids = [pre, *self.tokenize(prefix, add_special=False), suf, *self.tokenize(suffix, add_special=False), mid]
        return ([tok.bos_id] if tok.add_bos and tok.bos_id is not None else []) + ids

    def prompt_ids(self, prompt: Prompt) -> list[int]:
        """Token ids of a prompt string (special tokens parsed) or a message list (chat template)."""
        if isinstance(prompt, list):
            return self.chat_tokens(prompt)
        if not isinstance(prompt, str):
            raise MinferError(f"a prompt is a string or a list of messages, got {type(prompt).__name__}")
        return self.tokenize(prompt, parse_special=True)


class Model(Prompting):
    def __init__(self, path: str | os.PathLike | None = None, device: str = "cpu", *, progress: bool = True,
                 trace: str | os.PathLike | None = None, chat_template: str | None = None,
                 config: EngineConfig | None = None, **settings):
        self.path = Path(path) if path is not None else default_model_path()
        if config is None:
            config = EngineConfig.from_env(device=device, trace_path=trace, **settings)
        elif settings or trace is not None:
            raise MinferError("pass either config= or device/trace/settings keywords, not both")
        self.group = None  # parallel/launch.py Group: the tensor-parallel ranks, when split
        self.reader = GGUFReader(self.path)
        self.tokenizer = Tokenizer.from_metadata(self.reader.metadata)
        if chat_template is not None:
            self.tokenizer.set_chat_template(chat_template)
        env = dist_env()
        if config.tp > 1 or (env is not None and env.world > 1):
            from .models.registry import check_split
            from .parallel.launch import join

            if env is not None and env.rank != 0:
                raise ParallelError(f"this process is rank {env.rank} of a torchrun group: only rank 0 builds a "
                                    "Model; the other ranks call minfer.api.follow(path, config)")
            check_split(self.reader, env.world if env is not None else config.tp)  # before any rank starts
            self.group = join(config, self.path)
        try:
            self.engine = Engine.load(self.reader, config, tokenizer=self.tokenizer, progress=progress,
                                      comm=self.group.comm if self.group is not None else None)
        except BaseException:
            if self.group is not None:
                self.group.close()
            raise
        self.last_stats: GenerationStats | None = None

    # ------------------------------------------------------------------ properties
    @property
    def config(self) -> EngineConfig:
        return self.engine.config

    @property
    def n_ctx(self) -> int:
        return self.engine.n_ctx

    @property
    def n_slots(self) -> int:
        return self.engine.n_slots

    @property
    def n_vocab(self) -> int:
        return self.engine.n_vocab

    @property
    def args(self):
        """The architecture's Args (llama/qwen2 hyper-parameters read from the file)."""
        return self.engine.args

    def reset(self) -> None:
        """Forget cached prefixes: the next call runs its whole prompt."""
        self.engine.reset()

    @property
    def eog_ids(self) -> frozenset[int]:
        """Token ids that end a generation (unless ignore_eos)."""
        return self.engine.eog_ids

    def check_tokens(self, ids: list[int]) -> None:
        """Typed errors for an empty prompt, ids outside the vocabulary, or a prompt past the context."""
        self.engine.check_tokens(ids)

    # ------------------------------------------------------------------ compute
    def logits(self, token_ids: list[int]) -> torch.Tensor:
        """float32 [n_tokens, n_vocab]: the logits after each prefix of `token_ids` (one fresh
        sequence from position 0)."""
        ids = list(token_ids)
        if not ids:
            raise MinferError("logits() needs at least one token id")
        seq = self.engine.add(ids, SamplingParams(max_tokens=0), logit_rows=range(len(ids)), reuse_prefix=False)
        self.engine.run([seq])
        return torch.cat(seq.prompt_logits).clone()  # a normal tensor (the engine runs in inference mode)

    def submit(self, prompt: Prompt, params: SamplingParams | None = None) -> Sequence:
        """Queue one request; it runs as the engine steps (`run`, `generate`, `stream`). A seeded
        request runs its whole prompt (no reused prefix), so the same seed always gives the same text."""
        params = params or SamplingParams()
        ids = self.prompt_ids(prompt)
        return self.engine.add(ids, params, reuse_prefix=params.seed is None)

    def generate(self, prompt: Prompt, *, stream: bool = False, params: SamplingParams | None = None,
                 json_schema: dict | str | None = None, **sampling) -> str | Iterator[str]:
        """Continue a prompt (str; special tokens in it are parsed) or a chat (list of messages).
        Sampling keywords: engine.params.SamplingParams (max_tokens, temperature, top_k, top_p,
        min_p, repeat_penalty, repeat_last_n, frequency_penalty, presence_penalty, seed, stop,
        ignore_eos, logit_bias, grammar); temperature=0 is greedy. `json_schema`: the output is
        JSON matching this schema (a dict or its text; needs llguidance); `grammar` may also be
        GBNF text or an engine.grammar.Grammar. Returns the text, or with stream=True an iterator
        of text pieces (the request starts when it is first iterated). `last_stats` holds the
        token counts, timings and finish reason of the latest call. `params` replaces the keywords."""
        if params is not None and (sampling or json_schema is not None):
            raise MinferError("generate: pass either params= or sampling keywords, not both")
        params = params or sampling_params(json_schema, **sampling)
        ids = self.prompt_ids(prompt)
        self.engine.check_tokens(ids, params)  # errors now, not at the first piece

        def pieces() -> Iterator[str]:
            first = self.engine.steps == 0
            seq = self.engine.add(ids, params, reuse_prefix=params.seed is None)
            try:
                yield from self.engine.stream(seq)
            finally:
                self.last_stats = GenerationStats.of(seq, first)

        return pieces() if stream else "".join(pieces())

    def generate_batch(self, prompts: list[Prompt], *, params: list[SamplingParams] | None = None,
                       on_step: Callable[[int, int], None] | None = None, **sampling) -> list[GenerationResult]:
        """Generate for every prompt (strings or message lists) together, n_slots at a time; one
        result per prompt, in order. `sampling` applies to all; `params` gives one SamplingParams
        per prompt instead. `on_step(finished, generated_tokens)` is called after every step.
        A request's output is the same as when it runs alone (batch invariance; seeded requests
        included)."""
        if params is None:
            params = [sampling_params(**sampling)] * len(prompts)
        elif sampling or len(params) != len(prompts):
            raise MinferError("generate_batch: pass either sampling keywords or one SamplingParams per prompt")
        ids = []
        for i, p in enumerate(prompts):
            try:
                ids.append(self.prompt_ids(p))
                self.engine.check_tokens(ids[-1])
            except MinferError as e:
                raise type(e)(f"prompt {i}: {e}") from None
        seqs = [self.engine.add(x, sp, reuse_prefix=sp.seed is None) for x, sp in zip(ids, params, strict=True)]
        self.run(seqs, on_step)
        return [result_of(s) for s in seqs]

    def run(self, seqs: list[Sequence], on_step: Callable[[int, int], None] | None = None) -> None:
        """Step the engine until `seqs` are finished; aborts them if interrupted."""
        done = 0
        generated = 0
        try:
            while done < len(seqs):
                got = self.engine.step()
                if not got and not self.engine.scheduler.has_work():
                    break  # nothing left to run (every sequence ended)
                generated += len(got)
                done = sum(s.finished for s in seqs)
                if on_step is not None:
                    on_step(done, generated)
        finally:
            for s in seqs:
                if not s.finished:
                    self.engine.abort(s)

    def embed(self, texts: str | list[str] | list[list[int]], pooling: str | None = None) -> list[list[float]]:
        """One L2-normalised embedding per text (or token-id list): the final hidden states of its
        tokens pooled by `pooling` ("mean", "cls", "last"; default: the file's pooling type, else
        mean). Texts are tokenized as prompts (BOS as the model adds it) and run together, n_slots at
        a time, each alone in its slot: an embedding is the same alone and in a batch."""
        pooling = pooling or default_pooling(self.reader.metadata)
        items = [texts] if isinstance(texts, str) else list(texts)
        ids = []
        for i, t in enumerate(items):
            x = self.tokenize(t) if isinstance(t, str) else list(t)
            try:
                self.engine.check_tokens(x)
            except MinferError as e:
                raise type(e)(f"text {i}: {e}") from None
            ids.append(x)
        seqs = [self.engine.add(x, pooling=pooling) for x in ids]
        self.run(seqs)
        return [s.embedding() for s in seqs]

    def perplexity(self, text: str, n_ctx: int = 512, on_chunk=None) -> PerplexityResult:
        """llama-perplexity's measure of `text` (see engine.perplexity); chunks of n_ctx tokens."""
        return perplexity(self.engine, self.tokenizer, text, n_ctx, on_chunk)

    def close(self) -> None:
        """Write the trace (if recording) and release the file; stop the other ranks, if any."""
        self.engine.close()
        if self.group is not None:
            self.group.close()
            self.group = None

    def __enter__(self) -> Model:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
