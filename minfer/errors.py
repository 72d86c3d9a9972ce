"""Typed errors. Every failure a user can cause says what was expected and what was found.

All errors derive from MinferError so callers (CLI, server) can catch one base class and
report cleanly without a traceback.
"""

from __future__ import annotations


class MinferError(Exception):
    """Base class of every error minfer raises on purpose."""


def printable(text: str) -> str:
    """`text` with every character that is not printable (control characters: NUL, ESC, newlines)
    written as its Python escape, so a name read from a file can be shown on a terminal: a hostile
    key or tensor name must not move the cursor, recolour or retitle it."""
    return text if text.isprintable() else "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


class InsufficientMemoryError(MinferError):
    """A model (or its KV cache) needs more memory than the machine has available; raised before
    anything large is allocated."""

    def __init__(self, what: str, need: int, have: int, hint: str = ""):
        self.what, self.need, self.have = what, need, have
        super().__init__(f"{what} needs {need / 2**30:.2f} GiB of memory; this machine has "
                         f"{have / 2**30:.2f} GiB available{'; ' + hint if hint else ''}")


class GGUFError(MinferError):
    """A GGUF file is malformed. Carries the field, the byte offset and the reason."""

    def __init__(self, field: str, offset: int, reason: str):
        self.field = field
        self.offset = offset
        self.reason = reason
        super().__init__(f"GGUF: {printable(field)} at byte {offset}: {printable(reason)}")


class MetadataError(MinferError):
    """A metadata key is missing or has the wrong value type."""

    def __init__(self, key: str, reason: str):
        self.key = key
        self.reason = reason
        super().__init__(f"metadata {key!r}: {reason}")


class ParamError(MinferError):
    """A setting or request parameter has a bad value. `param` is its name as the API spells it
    (the CLI re-labels it with its flag), `reason` what is wrong with the value."""

    def __init__(self, param: str, reason: str):
        self.param = param
        self.reason = reason
        super().__init__(f"{param} {reason}")


class UnsupportedError(MinferError):
    """A valid input that minfer does not support (quant type, architecture, op/dtype/shape)."""


class QuantError(MinferError):
    """Quantized data does not fit its type: byte count not whole blocks, or shape/size mismatch."""


class ModelError(MinferError):
    """A model file has the right format but not the right content (missing/mis-shaped tensor)."""


class TokenizerError(MinferError):
    """The tokenizer section of a model is missing, inconsistent or unsupported."""


class TemplateError(MinferError):
    """A chat template failed to render, or tried something the sandbox forbids."""


class GrammarError(MinferError):
    """A request's grammar or JSON schema does not compile (the message names the problem)."""


class ContextOverflowError(MinferError):
    """A prompt (plus the requested tokens) does not fit the context window."""


class ContractError(MinferError):
    """A kernel contract failed validation. `rule` is the validator rule name."""

    def __init__(self, rule: str, section: str, field: str, reason: str):
        self.rule = rule
        self.section = section
        self.field = field
        self.reason = reason
        super().__init__(f"{rule}: [{section}] {field}: {reason}")


class NoKernelError(UnsupportedError):
    """No registered kernel contract accepts an (op, dtypes, shapes) combination."""


class DeviceError(MinferError):
    """The requested device is not available (e.g. cuda without a GPU)."""


class ParallelError(MinferError):
    """A model cannot be split the way tensor parallelism asks (a width the ranks do not divide,
    a quant block cut in two, more ranks than devices), or the ranks disagree."""
