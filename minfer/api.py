"""The Python API: `minfer.load(path)` -> a Model you can tokenize with, score and generate from.

    import minfer
    m = minfer.load()                                  # the default SmolLM2 model, on cpu
    ids = m.tokenize("The capital of France is")
    m.logits(ids)                                      # float32 [len(ids), n_vocab]
    m.generate("The capital of France is", max_tokens=16, temperature=0)
    for piece in m.generate([{"role": "user", "content": "Hi!"}], stream=True):
        print(piece, end="")

A Model holds one KV-cache slot and is not thread-safe; the server builds its own engine with
more slots. Successive generate() calls reuse the cached prefix they share (chat turns).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import torch

from .config import EngineConfig
from .default_model import default_model_path
from .engine.engine import Engine
from .engine.generate import GenerationStats, SlotState, generate_text
from .engine.perplexity import PerplexityResult, perplexity
from .engine.sampler import SamplingParams
from .errors import MinferError, TemplateError
from .gguf.reader import GGUFReader
from .tokenizer import Tokenizer

Messages = list[dict]


def load(path: str | os.PathLike | None = None, device: str = "cpu", *, n_ctx: int | None = None,
         progress: bool = True, trace: str | None = None) -> Model:
    """Load a GGUF model (default: SmolLM2-135M-Instruct) on `device` ("cpu"; "cuda" needs the cuda
    backend). `n_ctx` caps the context (default min(training context, 4096)); `trace` records a
    trace file (as MINFER_TRACE does)."""
    return Model(path, device, n_ctx=n_ctx, progress=progress, trace=trace)


class Model:
    def __init__(self, path: str | os.PathLike | None = None, device: str = "cpu", *,
                 n_ctx: int | None = None, progress: bool = True, trace: str | None = None):
        self.path = Path(path) if path is not None else default_model_path()
        config = EngineConfig.from_env(device, trace_path=trace)
        self.reader = GGUFReader(self.path)
        self.tokenizer = Tokenizer.from_metadata(self.reader.metadata)
        self.engine = Engine(self.reader, config=config, n_ctx=n_ctx, progress=progress,
                             token_text=lambda t: self.tokenizer.decode([t]))
        self._state = SlotState(self.engine.cache.acquire())
        self.last_stats: GenerationStats | None = None

    # ------------------------------------------------------------------ properties
    @property
    def n_ctx(self) -> int:
        return self.engine.n_ctx

    @property
    def n_vocab(self) -> int:
        return self.engine.n_vocab

    @property
    def slot(self) -> int:
        """The engine KV-cache slot this model generates in (for direct `engine` use; call
        reset() after writing to it yourself)."""
        return self._state.slot

    def reset(self) -> None:
        """Forget the cached prefix: the next call prefills its whole prompt."""
        self._state.tokens.clear()

    @property
    def args(self):
        """The architecture's Args (llama/qwen2 hyper-parameters read from the file)."""
        return self.engine.args

    # ------------------------------------------------------------------ tokens
    def tokenize(self, text: str, add_special: bool = True, parse_special: bool = False) -> list[int]:
        return self.tokenizer.encode(text, add_special=add_special, parse_special=parse_special)

    def detokenize(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids)

    def chat_tokens(self, messages: Messages, add_generation_prompt: bool = True) -> list[int]:
        """Render messages with the model's chat template and tokenize (special tokens parsed).
        A template that already writes BOS does not get a second one."""
        if not isinstance(messages, list):
            raise TemplateError("messages must be a list of {'role': ..., 'content': ...} dicts")
        text = self.tokenizer.apply_chat_template(messages, add_generation_prompt=add_generation_prompt)
        ids = self.tokenizer.encode(text, add_special=True, parse_special=True)
        bos = self.tokenizer.bos_id
        if len(ids) >= 2 and ids[0] == ids[1] == bos:
            ids = ids[1:]
        return ids

    # ------------------------------------------------------------------ compute
    def logits(self, token_ids: list[int]) -> torch.Tensor:
        """float32 [n_tokens, n_vocab]: the logits after each prefix of `token_ids` (one fresh
        sequence from position 0)."""
        ids = [int(t) for t in token_ids]
        if not ids:
            raise MinferError("logits() needs at least one token id")
        self.reset()
        out = self.engine.prefill(self._state.slot, ids, rows=range(len(ids)))
        self.engine.finish(None, out[-1])
        self._state.tokens.extend(ids)
        return out.clone()  # a normal tensor (the engine computes under torch.inference_mode)

    def generate(self, prompt: str | Messages, *, stream: bool = False, **sampling) -> str | Iterator[str]:
        """Continue a prompt (str; special tokens in it are parsed) or a chat (list of messages).
        Sampling keywords: see engine.sampler.SamplingParams (max_tokens, temperature, top_k,
        top_p, min_p, repeat_penalty, repeat_last_n, seed, stop, ignore_eos); temperature=0 is
        greedy. Returns the text, or with stream=True an iterator of text pieces.
        `last_stats` holds the token counts, timings and finish reason of the latest call.
        With an explicit `seed` the call starts from an empty cache, so the same seed always gives
        the same text (a reused prefix would run the prompt's last token as a one-row step, whose
        logits differ from a many-row prefill's by rounding)."""
        params = SamplingParams(**sampling)
        if params.seed is not None:
            self.reset()
        if isinstance(prompt, list):
            ids = self.chat_tokens(prompt)
        else:
            ids = self.tokenize(prompt, parse_special=True)
        if not ids:
            raise MinferError("the prompt is empty: nothing to generate from")
        self.engine.check_tokens(ids)  # a prompt longer than the context fails here, not mid-stream
        self.last_stats = GenerationStats()
        pieces = generate_text(self.engine, self.tokenizer, ids, params, self._state, self.last_stats)
        return pieces if stream else "".join(pieces)

    def perplexity(self, text: str, n_ctx: int = 512, on_chunk=None) -> PerplexityResult:
        """llama-perplexity's measure of `text` (see engine.perplexity); chunks of n_ctx tokens."""
        self.reset()  # the chunks overwrite the slot
        return perplexity(self.engine, self.tokenizer, text, n_ctx, self._state.slot, on_chunk)

    def close(self) -> None:
        """Write the trace (if recording) and release the file."""
        self.engine.close()

    def __enter__(self) -> Model:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
