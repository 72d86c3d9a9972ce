"""Constrained decoding: a request's grammar (JSON schema, any JSON object, GBNF, Lark, regex) as a
token mask, through llguidance (docs/SERVER.md "Structured outputs" says why that library).

    g = Grammar.json_schema({"type": "object", ...})   # or .json_object(), .gbnf(text), .lark(text)
    check_grammar(g, tokenizer)                        # GrammarError naming the problem (the server's 400)

`Grammar` is plain data (it rides in SamplingParams, through the server's pipe); llguidance is
imported only when a grammar is compiled, so a model without one never loads it. The engine
gives each constrained sequence its own `Matcher` (its parser state); engine/masks.py computes
and applies the masks. No torch here (SamplingParams carries a Grammar; the CLI checks its flags
without loading torch).
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass

from ..errors import GrammarError, MinferError

KINDS = ("json_schema", "json_object", "gbnf", "lark", "regex")
# JSON as one line with ", " and ": " between items (llguidance's non-flexible whitespace): a model
# cannot spend its tokens on whitespace, which the flexible default lets it (greedy SmolLM2 wrote
# dozens of blank lines inside an object). A schema's own "x-guidance" options override this.
JSON_OPTIONS = {"whitespace_flexible": False}
INSTALL_HINT = "pip install 'minfer[structured]' (llguidance)"
# llguidance's slices (docs/optimizations.md in its repository): token subsets, each a regex, whose
# mask is added whole, without walking the token trie, wherever the lexer allows all of it. Its
# default set covers JSON strings of any length and of maxLength >= 10 or >= 30; a string bounded
# shorter, or one whose bound is nearly spent, walked the whole 152k-token trie at every token (a
# 16-row step of an array of strings of maxLength 24: 5.0 ms on the H200's host, more than a 7B's
# 4.9 ms forward, so the masks set the step's pace). A ladder of shorter bounds as well: 2.1-2.5 ms
# there; here (2-core EPYC, 16 rows, fresh states) 2.25 -> 1.39 ms, maxLength 8 2.10 -> 1.51,
# unbounded strings 0.44 -> 0.36; the tokenizer view costs once 0.85 -> 1.5 s and 75 -> 128 MB for
# a 152k vocabulary (bench/NOTES.md, stop 43). Fewer rungs bought less (3/6/15/20: 1.87 ms).
JSON_STRING = r'[^"\\\x00-\x1F\x7F]'
SLICE_BOUNDS = (2, 4, 6, 8, 12, 16, 20, 24)


@dataclass(frozen=True)
class Grammar:
    """What a request's output must match. `kind`: one of KINDS; `text`: the schema as JSON
    text, or the grammar's source (empty for json_object)."""

    kind: str
    text: str = ""

    def __post_init__(self):
        if self.kind not in KINDS:
            raise GrammarError(f"grammar kind must be one of {', '.join(KINDS)}, got {self.kind!r}")
        if not isinstance(self.text, str):
            raise GrammarError(f"grammar text must be a string, got {type(self.text).__name__}")

    @classmethod
    def json_schema(cls, schema: dict | str) -> Grammar:
        """A JSON schema (a dict, or its JSON text)."""
        if isinstance(schema, str):
            try:
                schema = json.loads(schema)
            except ValueError as e:
                raise GrammarError(f"the JSON schema is not valid JSON: {e}") from None
        if not isinstance(schema, dict | bool):
            raise GrammarError(f"a JSON schema is an object, got {type(schema).__name__}")
        return cls("json_schema", json.dumps(schema))

    @classmethod
    def json_object(cls) -> Grammar:
        """Any JSON object (OpenAI's response_format {"type": "json_object"})."""
        return cls("json_object")

    @classmethod
    def gbnf(cls, text: str) -> Grammar:
        """llama.cpp's GBNF (llama-server's `grammar` field); a Lark grammar is accepted too."""
        return cls("gbnf", text)

    @classmethod
    def lark(cls, text: str) -> Grammar:
        """llguidance's Lark dialect (special tokens as <|name|>, inline JSON schemas as %json {...})."""
        return cls("lark", text)

    def compiled(self) -> str:
        """llguidance's grammar definition; GrammarError when the source does not convert."""
        llg = llguidance()
        try:
            if self.kind == "json_object":
                return llg.LLMatcher.grammar_from_json_schema({"type": "object"}, defaults=JSON_OPTIONS)
            if self.kind == "json_schema":
                return llg.LLMatcher.grammar_from_json_schema(self.text, defaults=JSON_OPTIONS)
            return llg.grammar_from("gbnf" if self.kind == "gbnf" else self.kind, self.text)
        except Exception as e:  # noqa: BLE001 (ValueError mostly; any failure to convert is the grammar's)
            raise GrammarError(f"{self.kind}: {e}") from None


def llguidance():
    try:
        import llguidance
    except ImportError:
        raise MinferError(f"structured outputs need the llguidance package: {INSTALL_HINT}") from None
    return llguidance


@functools.lru_cache(maxsize=4)
def ll_tokenizer(tokenizer, n_vocab: int | None = None):
    """llguidance's view of a minfer Tokenizer (built once per tokenizer and width: 0.4 s for
    SmolLM2's 49k vocabulary, 1.5 s for a 152k one, the slices included): every token's bytes,
    control and user-defined `<...>` tokens marked special (so a grammar names them as
    <|im_end|>), the end-of-generation ids as its EOS set, the slices above. `n_vocab`: the
    model's logits width when it exceeds the tokenizer's (the extra ids are never allowed)."""
    from ..tokenizer.vocab import ATTR_CONTROL, ATTR_USER_DEFINED

    llg = llguidance()
    attrs = tokenizer.vocab_attrs
    pieces = []
    for i in range(tokenizer.n_vocab):
        p = tokenizer.token_to_piece(i, special=True)
        if attrs[i] & (ATTR_CONTROL | ATTR_USER_DEFINED) and p.startswith(b"<"):
            p = b"\xff" + p  # llguidance's mark of a special token
        pieces.append(p)

    class Wrapped:
        eos_token_id = tokenizer.eos_id
        bos_token_id = tokenizer.bos_id
        tokens = pieces
        special_token_ids = [i for i in range(tokenizer.n_vocab) if attrs[i] & ATTR_CONTROL]

        def __call__(self, s: str | bytes) -> list[int]:
            text = s.decode("utf-8", "replace") if isinstance(s, bytes) else s
            return tokenizer.encode(text, add_special=False)

    eos = sorted(tokenizer.eot_ids) or ([tokenizer.eos_id] if tokenizer.eos_id is not None else [])
    slices = llg.LLTokenizer.general_slices() + [f"{JSON_STRING}{{1,{n}}}" for n in SLICE_BOUNDS]
    return llg.LLTokenizer(llg.TokenizerWrapper(Wrapped()), n_vocab=max(n_vocab or 0, tokenizer.n_vocab),
                           eos_token=eos, slices=slices)


def check_grammar(grammar: Grammar, tokenizer=None) -> None:
    """GrammarError naming the problem when `grammar` does not compile (against `tokenizer`'s
    special tokens when given): what the server answers with a 400 before anything runs."""
    llg = llguidance()
    compiled = grammar.compiled()
    lt = ll_tokenizer(tokenizer) if tokenizer is not None else None
    try:
        error, messages = llg.LLMatcher.validate_grammar_with_warnings(compiled, lt)
    except Exception as e:  # noqa: BLE001 (whatever the library raises on a client's grammar is the client's 400)
        raise GrammarError(f"{grammar.kind}: {e}") from None
    if error:
        raise GrammarError(f"{grammar.kind}: {messages[0] if messages else 'invalid grammar'}")


class Matcher:
    """One sequence's parser state: which tokens may come next; advanced by each sampled token."""

    def __init__(self, grammar: Grammar, tokenizer, n_vocab: int):
        llg = llguidance()
        self.inner = llg.LLMatcher(ll_tokenizer(tokenizer, n_vocab), grammar.compiled(), log_level=0)
        if self.inner.is_error():
            raise GrammarError(f"{grammar.kind}: {self.inner.get_error()}")

    def consume(self, token: int) -> bool:
        """Advance by `token`; False when the grammar refuses it (the matcher is then in error)."""
        return self.inner.consume_token(token)

    @property
    def done(self) -> bool:
        """The grammar is complete and allows nothing more (only an end token)."""
        return self.inner.is_stopped()

    @property
    def error(self) -> str:
        return self.inner.get_error()
