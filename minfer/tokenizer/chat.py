"""Chat templates: render a model's `tokenizer.chat_template` (Jinja2) safely.

A chat template comes from the model file, so it is untrusted code. It runs in jinja2's
`ImmutableSandboxedEnvironment` (no `_private` attributes, no mutation of lists/dicts, no unsafe
callables) with the HF-transformers conventions (`trim_blocks`, `lstrip_blocks`, loop controls,
`raise_exception`, `strftime_now`, a `tojson` filter with `indent`/`ensure_ascii`, `tools=None`).
The sandbox stops code execution but not resource exhaustion, so on top of it:

- the template source is at most 64 KiB;
- every attribute/item access, call, filter, intercepted operator (`*`, `**`, `%`, `+`), loop
  iteration and output chunk checks a wall-clock deadline (2 s);
- `{% for %}` loops are rewritten to iterate through a counter (at most 100 000 iterations per
  render, which also bounds nested empty loops), `range()` yields at most 10 000 items;
- values and the output are at most 1 MiB (characters plus elements, nested values included;
  at most 100 000 items in one list/dict). Everything that can build a bigger string is checked
  *before* it allocates: `{{ }}` output (jinja's `finalize`), `~` and list/tuple/dict literals
  (rewritten into guarded calls), the joined output of `{% set %}` blocks and macros (jinja's
  `concat`), the inputs of every call, filter and operator, and the size-multiplying ones by
  their predicted result (`'x' * n`, `'%999999999d'`, `'{:>999999999}'.format`, `|center`,
  `|indent`, `|join` (with `attribute=` too), `|replace`, `|wordwrap`, `|sum`, `|tojson` (its
  separators at most 64 characters, the output estimated from the items, indent and depth),
  `str.join`, `str.expandtabs`, `str.translate` (each character's replacement counted),
  `n ** m`, `str.format` / `%` by all their fields together: each one's width and precision and
  the value it prints, a value named by many fields counted each time), ...); integer arguments
  above 2^20 are refused;
- lazy filter results (`map`, `select`, `reject`, `batch`, `unique`, ...) count their items as
  they are drawn, so `|list` or `|join` of a generator never builds more than the limit;
- filters and attribute lookups are never constant-folded at compile time (they only run
  inside a render, under these limits).

Any failure or violation is a TemplateError. A model without a template gets its family's
built-in template where the vocabulary names the family (templates.py `builtin_template`: Gemma's turns for a
vocabulary with `<start_of_turn>` / `<end_of_turn>`, as the Gemma 3 270M GGUF on PyPI has no
template), else ChatML (`<|im_start|>{role}\\n{content}<|im_end|>\\n` per message, then
`<|im_start|>assistant\\n`).
"""

from __future__ import annotations

import contextvars
import functools
import json
import re
import string
import time
from collections.abc import Iterator, Mapping
from datetime import datetime
from typing import Any

import jinja2
import jinja2.ext
from jinja2 import nodes
from jinja2.runtime import LoopContext, Namespace
from jinja2.sandbox import ImmutableSandboxedEnvironment
from jinja2.visitor import NodeTransformer

from ..errors import TemplateError
from .templates import CHATML_TEMPLATE, GEMMA_TEMPLATE, builtin_template  # noqa: F401 (re-exported)

MAX_TEMPLATE_BYTES = 64 * 1024
MAX_SIZE = 1 << 20  # output characters; also any string/list/dict value the template handles
MAX_INT_ARG = 1 << 20  # integer arguments to calls and filters
MAX_INT_BITS = 1 << 16  # integers produced by * and **
MAX_ELEMENTS = 100_000  # items in one list/tuple/dict
MAX_RANGE = 10_000
MAX_LOOP_ITERATIONS = 100_000
MAX_JSON_INDENT = 64
RENDER_SECONDS = 2.0

class _Budget:
    """Per-render limits: a deadline and the loop-iteration count."""

    def __init__(self, seconds: float):
        self.deadline = time.monotonic() + seconds
        self.iterations = 0


_BUDGET: contextvars.ContextVar[_Budget | None] = contextvars.ContextVar("minfer_template_budget", default=None)


def _budget() -> _Budget:
    budget = _BUDGET.get()
    if budget is None:
        # outside a render (jinja's compile-time constant folding): refuse, so the expression is
        # evaluated at render time under the limits
        raise TemplateError("not evaluated outside a render")
    if time.monotonic() > budget.deadline:
        raise TemplateError("chat template exceeded its render time limit")
    return budget


_CONTAINERS = (list, tuple, set, frozenset, dict, Namespace)
_SCALARS = frozenset((int, float, bool, type(None)))


def _size(x: Any) -> int:
    """Characters and elements in `x`, nested containers included and shared parts counted each
    time they occur (so roughly a lower bound of len(str(x))). Anything above the limits counts
    as MAX_SIZE + 1, and so does a namespace met twice (only namespaces can form cycles)."""
    if isinstance(x, (str, bytes)):
        return len(x)
    if not isinstance(x, _CONTAINERS):
        return 0
    total = 0
    stack = [x]
    namespaces: set[int] = set()
    while stack and total <= MAX_SIZE:
        v = stack.pop()
        if isinstance(v, (str, bytes)):
            total += len(v)
        elif isinstance(v, _CONTAINERS):
            if isinstance(v, Namespace):
                if id(v) in namespaces:
                    return MAX_SIZE + 1
                namespaces.add(id(v))
                v = v._Namespace__attrs  # its attribute dict (no public accessor)
            if len(v) > MAX_ELEMENTS:
                return MAX_SIZE + 1
            total += max(len(v), 1)
            items = [*v.keys(), *v.values()] if isinstance(v, dict) else v
            stack.extend(e for e in items if e.__class__ not in _SCALARS)
    return total


def _check_size(x: Any, what: str = "value") -> Any:
    if _size(x) > MAX_SIZE:
        raise TemplateError(f"chat template {what} exceeds {MAX_SIZE} characters/elements")
    return x


def _check_ints(args: tuple, kwargs: Mapping[str, Any]) -> None:
    for a in (*args, *kwargs.values()):
        if isinstance(a, int) and not isinstance(a, bool) and abs(a) > MAX_INT_ARG:
            raise TemplateError(f"chat template passed an integer argument above {MAX_INT_ARG}")


def _refuse_if(predicted: int, what: str) -> None:
    if predicted > MAX_SIZE:
        raise TemplateError(f"chat template {what} would produce more than {MAX_SIZE} characters/elements")


_PRINTF_FIELD = re.compile(r"%(?:\([^)]*\))?[#0\- +]*(\*|\d+)?(?:\.(\*|\d+))?")


def _text_bound(x: Any) -> int:
    """An upper bound of len(str(x)) or len(repr(x)) (what a format field can print), stopping
    early above MAX_SIZE: strings their length (repr: at most 10 characters each, "\\U0001f600"),
    integers their digits with grouping commas, other scalars 330 (a float's longest form),
    containers their items' bounds plus separators."""
    total, stack = 0, [x]
    while stack and total <= MAX_SIZE:
        v = stack.pop()
        if isinstance(v, (str, bytes)):
            total += 10 * len(v) + 3
        elif isinstance(v, bool) or v is None:
            total += 5
        elif isinstance(v, int):
            total += v.bit_length() * 41 // 100 + 3
        elif isinstance(v, _CONTAINERS):
            if isinstance(v, Namespace):
                v = v._Namespace__attrs
            if len(v) > MAX_ELEMENTS:
                return MAX_SIZE + 1
            items = [*v.keys(), *v.values()] if isinstance(v, dict) else list(v)
            total += 4 * len(items) + 16
            stack.extend(items)
        else:
            total += 330
    return total


def _check_printf(fmt: str | bytes, args: Any) -> None:
    """Refuse printf formats whose result could pass MAX_SIZE: a width or precision above it, or
    all fields together (each at least its width and precision, and the value it prints)."""
    text = fmt.decode("latin-1") if isinstance(fmt, bytes) else fmt
    fields = list(_PRINTF_FIELD.finditer(text))
    pads = 0
    for m in fields:
        for g in m.groups():
            if g and g != "*":
                if int(g) > MAX_SIZE:
                    raise TemplateError("chat template format width is too large")
                pads += int(g)
    if "*" in text:
        _check_ints(args if isinstance(args, tuple) else (args,), {})
        pads += sum(a for a in (args if isinstance(args, tuple) else (args,)) if isinstance(a, int))
    if isinstance(args, Mapping):  # "%(a)s" may name one value many times
        values = max((_text_bound(v) for v in args.values()), default=0) * len(fields)
    else:
        values = _text_bound(args)
    _refuse_if(len(text) + pads + values, "format")


def _check_format_spec(fmt: str, args: tuple, kwargs: Mapping[str, Any]) -> None:
    """Refuse str.format calls whose result could pass MAX_SIZE, before it is built: a width
    above MAX_SIZE (nested fields included), or the fields together (each one at least its width
    and precision, and the value it names: a value named by many fields counts each time; one
    reached through attributes or items counts as the whole argument)."""
    try:
        fields = list(string.Formatter().parse(fmt))
    except ValueError as e:
        raise TemplateError(f"chat template format string: {e}") from None
    nested = max((a for a in (*args, *kwargs.values()) if isinstance(a, int) and not isinstance(a, bool)),
                 default=0)
    total, auto = 0, 0
    bounds: dict[Any, int] = {}
    for literal, name, spec, _ in fields:
        total += len(literal)
        if name is None:
            continue
        pad = 0
        if spec:
            if "{" in spec:
                _check_ints(args, kwargs)
                pad += 2 * nested
            digits = [int(d) for d in re.findall(r"\d+", spec)]
            if any(d > MAX_SIZE for d in digits):
                raise TemplateError("chat template format width is too large")
            pad += sum(digits)
        key = re.split(r"[.\[]", name, maxsplit=1)[0]
        if key == "":
            key, auto = auto, auto + 1
        elif key.isdigit():
            key = int(key)
        if key not in bounds:
            value = (args[key] if key < len(args) else None) if isinstance(key, int) else kwargs.get(key)
            bounds[key] = _text_bound(value)
        total += pad + bounds[key]
        if total > MAX_SIZE:
            break
    _refuse_if(total, "format()")


def _predict_replace(s: Any, old: Any, new: Any, count: Any) -> None:
    if isinstance(s, (str, bytes)) and isinstance(old, type(s)) and isinstance(new, type(s)):
        hits = s.count(old) if old else len(s) + 1
        if isinstance(count, int) and count >= 0:
            hits = min(hits, count)
        _refuse_if(len(s) + hits * (len(new) - len(old)), "replace()")


def _join_items(sep: Any, items: Any) -> list:
    items = list(items)
    _check_size(items, "join() input")
    total = len(sep) * max(len(items) - 1, 0) if isinstance(sep, (str, bytes)) else 0
    total += sum(len(x) if isinstance(x, (str, bytes)) else len(str(x)) for x in items)
    _refuse_if(total, "join()")
    return items


# --- guarded string methods and filters -----------------------------------------------------------
def _guard_str_method(obj: Any, args: tuple, kwargs: dict) -> tuple:
    """Size pre-checks for bound methods of str/bytes; returns possibly rewritten args."""
    name = getattr(obj, "__name__", "")
    s = obj.__self__
    if name == "replace" and len(args) >= 2:
        _predict_replace(s, args[0], args[1], args[2] if len(args) > 2 else kwargs.get("count", -1))
    elif name == "join" and args:
        args = (_join_items(s, args[0]), *args[1:])
    elif name == "expandtabs":
        tab = args[0] if args else kwargs.get("tabsize", 8)
        if isinstance(tab, int):
            _refuse_if(len(s) + s.count("\t" if isinstance(s, str) else b"\t") * tab, "expandtabs()")
    elif name == "translate" and args:
        _predict_translate(s, args[0])
    elif name in ("upper", "lower", "title", "capitalize", "swapcase", "casefold") and isinstance(s, str):
        _refuse_if(3 * len(s), f"{name}()")  # one character can map to three ("\ufb03".upper() == "FFI")
    return args


def _predict_translate(s: Any, table: Any) -> None:
    """str.translate maps each character to a string of any length: the result's length, before."""
    if not isinstance(s, str) or not isinstance(table, Mapping):
        return
    lengths: dict[int, int] = {}
    total = 0
    for ch in s:
        c = ord(ch)
        if c not in lengths:
            out = table.get(c, ch)
            lengths[c] = len(out) if isinstance(out, str) else 1
        total += lengths[c]
        if total > MAX_SIZE:
            break
    _refuse_if(total, "translate()")


def urlize_bound(text: str, target: Any = None, rel: Any = None) -> int:
    """At least the length of `text|urlize`, from counts (no allocation): every word of the escaped
    text may become `<a href="https://WORD" rel=".." target="..">WORD</a>` (jinja2.utils.urlize)."""
    escaped = (len(text) + 4 * (text.count("&") + text.count('"') + text.count("'"))
               + 3 * (text.count("<") + text.count(">")))
    words = re.subn(r"\S+", "", text)[1]
    tag = 64 + 5 * (len(str(target or "")) + len(str(rel or "")))  # the tags, the scheme, rel="nofollow noopener"
    return 2 * escaped + words * tag


def _guard_filter_args(name: str, args: list, kwargs: dict, value_at: int) -> None:
    """Size pre-checks for the jinja filters that can multiply their input. Mutates args."""
    value = args[value_at] if len(args) > value_at else None
    rest = args[value_at + 1:]

    def arg(i: int, key: str, default: Any) -> Any:
        return rest[i] if len(rest) > i else kwargs.get(key, default)

    if name == "replace":
        s = str(value) if value is not None else ""
        _predict_replace(s, str(arg(0, "old", "")), str(arg(1, "new", "")), arg(2, "count", None))
    elif name == "join" and value is not None:
        if arg(1, "attribute", None) is None:
            args[value_at] = _join_items(arg(0, "d", ""), value)
        else:  # the items' attributes are joined: the separators alone must fit
            items = list(value)
            args[value_at] = items
            sep = arg(0, "d", "")
            _refuse_if(len(sep) * max(len(items) - 1, 0) if isinstance(sep, str) else 0, "join()")
    elif name == "sum" and value is not None:  # sum of lists or strings concatenates them
        items = list(value)
        args[value_at] = items
        start = arg(1, "start", 0)
        if isinstance(start, (list, tuple, str)) or any(isinstance(x, (list, tuple, str)) for x in items[:1]):
            _refuse_if(_size(start) + sum(_size(x) for x in items), "sum")
    elif name == "indent":
        width = arg(0, "width", 4)
        pad = len(width) if isinstance(width, str) else width if isinstance(width, int) else 0
        s = str(value) if value is not None else ""
        _refuse_if(len(s) + (s.count("\n") + 1) * pad, "indent")
    elif name == "format" and isinstance(value, str):
        _check_printf(value, tuple(rest) or kwargs)
    elif name == "wordwrap":
        wrap = arg(2, "wrapstring", None)
        if isinstance(wrap, str):
            _refuse_if(len(str(value)) * max(len(wrap), 1), "wordwrap")
    elif name in ("string", "pprint") and not isinstance(value, str):  # repr of a container: escapes, quotes
        _refuse_if(_text_bound(value), f"|{name}")
    elif name in ("upper", "lower", "title", "capitalize") and isinstance(value, str):
        _refuse_if(3 * len(value), f"|{name}")  # one character can map to three ("\ufb03".upper() == "FFI")
    elif name == "urlize" and value is not None:
        _refuse_if(urlize_bound(str(value), arg(2, "target", None), arg(3, "rel", None)), "|urlize")
    elif name in ("slice", "batch"):
        n = arg(0, "slices" if name == "slice" else "linecount", 0)
        if isinstance(n, int) and n > MAX_RANGE:
            raise TemplateError(f"chat template {name} count above {MAX_RANGE}")


def _tojson(value: Any, ensure_ascii: bool = False, indent: Any = None, separators: Any = None,
            sort_keys: bool = False) -> str:
    """HF's tojson: json.dumps with the usual knobs (unicode kept, optional indent); the output's
    length is predicted (separators and indentation repeat per item and nesting level) and refused
    before json.dumps builds it."""
    if isinstance(indent, int) and not isinstance(indent, bool) and indent > MAX_JSON_INDENT:
        raise TemplateError(f"tojson indent above {MAX_JSON_INDENT}")
    if isinstance(indent, str) and len(indent) > MAX_JSON_INDENT:
        raise TemplateError(f"tojson indent above {MAX_JSON_INDENT}")
    if separators is not None:
        if (not isinstance(separators, (list, tuple)) or len(separators) != 2
                or not all(isinstance(x, str) and len(x) <= MAX_JSON_INDENT for x in separators)):
            raise TemplateError(f"tojson separators must be two strings of at most {MAX_JSON_INDENT} characters")
    pad = (indent if isinstance(indent, int) else len(indent)) if indent is not None else 0
    seps = sum(len(x) for x in separators) if separators is not None else 3
    _refuse_if(_json_estimate(value, pad, seps), "tojson")
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _json_estimate(value: Any, pad: int, seps: int) -> int:
    """A lower bound of json.dumps(value)'s length: every string (escapes counted as one), every
    item's separators and, with an indent, its newline and pad * depth."""
    total, stack = 0, [(value, 1)]
    while stack and total <= MAX_SIZE:
        v, depth = stack.pop()
        if isinstance(v, str):
            total += len(v) + 2
        elif isinstance(v, (list, tuple, dict)):
            items = [*v.keys(), *v.values()] if isinstance(v, dict) else list(v)
            total += 2 + len(items) * (seps + (1 + pad * depth if pad else 0))
            stack.extend((e, depth + 1) for e in items)
        else:
            total += 1
    return total


def _check_all(values: Any, what: str) -> None:
    total = 0
    for v in values:
        total += _size(v)
        if total > MAX_SIZE:
            raise TemplateError(f"chat template {what} exceeds {MAX_SIZE} characters/elements")


def _guarded_concat(parts: Any) -> str:
    """environment.concat: joins the output of {% set %} blocks, macros, {% filter %}/{% call %}."""
    parts = list(parts)
    _check_all(parts, "block output")
    return "".join(parts)


def _join_parts(*parts: Any) -> str:
    """The `~` operator (jinja's Concat node), refused before joining when the result is too big."""
    _check_all(parts, "~ concatenation")
    return "".join(map(str, parts))


def _checked_output(value: Any) -> Any:
    """environment.finalize: every {{ expression }} passes here before it becomes text."""
    return _check_size(value, "output value")


def _raise_exception(message: Any = "") -> None:
    raise TemplateError(f"chat template raised: {message}")


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


def _range(*args: Any) -> range:
    r = range(*args)
    if len(r) > MAX_RANGE:
        raise TemplateError(f"chat template range() of {len(r)} items (limit {MAX_RANGE})")
    return r


class _SizedIterator:
    """A lazy filter result (map, select, batch, unique, ...) whose items are counted as they are
    drawn: more than MAX_SIZE characters/elements in all is refused before the next item is
    handed on, so `|list` or `|join` of a generator never builds more than the limit (each
    item's own size is checked by the filter that made it)."""

    def __init__(self, inner: Any, what: str):
        self._inner, self._what, self._total = iter(inner), what, 0

    def __iter__(self):
        return self

    def __next__(self) -> Any:
        _budget()
        item = next(self._inner)
        self._total += max(_size(item), 1)
        if self._total > MAX_SIZE:
            raise TemplateError(f"chat template {self._what} result exceeds {MAX_SIZE} characters/elements")
        return item


class _CountedIterable:
    """What a rewritten `{% for %}` iterates: the original iterable, counted against the budget."""

    def __init__(self, inner: Any):
        self._inner = inner

    def __len__(self) -> int:
        return len(self._inner)

    def __iter__(self):
        for item in self._inner:
            budget = _budget()
            budget.iterations += 1
            if budget.iterations > MAX_LOOP_ITERATIONS:
                raise TemplateError(f"chat template ran more than {MAX_LOOP_ITERATIONS} loop iterations")
            yield item


class _Rewrite(NodeTransformer):
    """Route the constructs that run without any sandbox hook through guarded functions:
    loop iteration (counted), `~` (size-checked join) and list/tuple/dict literals (size-checked)."""

    @staticmethod
    def _call(name: str, args: list, lineno: int) -> nodes.Call:
        return nodes.Call(nodes.EnvironmentAttribute(name), args, [], None, None, lineno=lineno)

    def visit_For(self, node: nodes.For) -> nodes.Node:
        self.generic_visit(node)
        node.iter = self._call("count_iterations", [node.iter], node.lineno)
        return node

    def visit_Concat(self, node: nodes.Concat) -> nodes.Node:
        self.generic_visit(node)
        return self._call("join_parts", node.nodes, node.lineno)

    def _literal(self, node: nodes.Expr) -> nodes.Node:
        self.generic_visit(node)
        if getattr(node, "ctx", "load") != "load":
            return node
        return self._call("literal", [node], node.lineno)

    visit_List = visit_Tuple = visit_Dict = _literal


class _GuardedEnvironment(ImmutableSandboxedEnvironment):
    """ImmutableSandboxedEnvironment plus deadline, loop, size and integer guards."""

    intercepted_binops = frozenset({"*", "**", "%", "+"})

    # called by the rewritten template (see _Rewrite)
    count_iterations = _CountedIterable
    join_parts = staticmethod(_join_parts)
    literal = staticmethod(lambda value: value)  # the call hook checks the size of the result

    def __init__(self):
        super().__init__(trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols],
                         finalize=_checked_output)
        self.concat = _guarded_concat
        self.globals.pop("lipsum", None)  # lipsum(n) is an unbounded text generator
        self.globals.update(range=_range, raise_exception=_raise_exception, strftime_now=_strftime_now)
        self.filters["tojson"] = _tojson
        self.filters = {name: self._guarded_filter(name, f) for name, f in self.filters.items()}

    def _guarded_filter(self, name: str, f: Any) -> Any:
        value_at = 1 if hasattr(f, "jinja_pass_arg") else 0

        @functools.wraps(f)
        def guarded(*args: Any, **kwargs: Any) -> Any:
            _budget()
            args_l = list(args)
            _check_all((*args_l[value_at:], *kwargs.values()), f"|{name} input")
            _check_ints(tuple(args_l[value_at + 1:]), kwargs)
            _guard_filter_args(name, args_l, kwargs, value_at)
            result = f(*args_l, **kwargs)
            if isinstance(result, Iterator):  # a lazy result: its items are counted as they are drawn
                return _SizedIterator(result, f"|{name}")
            return _check_size(result, f"|{name} result")

        return guarded

    # sandbox hooks
    def unsafe_undefined(self, obj: Any, attribute: str) -> Any:
        raise TemplateError(f"chat template tried to access {type(obj).__name__}.{attribute}, which is not allowed")

    def getattr(self, obj: Any, attribute: str) -> Any:
        _budget()
        return _check_size(super().getattr(obj, attribute))

    def getitem(self, obj: Any, argument: Any) -> Any:
        _budget()
        return _check_size(super().getitem(obj, argument))

    def call(self, context: Any, obj: Any, /, *args: Any, **kwargs: Any) -> Any:  # type: ignore[override]
        _budget()
        _check_ints(args, kwargs)
        if obj is not _CountedIterable:  # iterating a big value is fine; the loop count is limited
            _check_all((*args, *kwargs.values()), "call arguments")
        if isinstance(obj, LoopContext) and args:  # recursive loop: count the nested iterable too
            args = (_CountedIterable(args[0]), *args[1:])
        if isinstance(getattr(obj, "__self__", None), (str, bytes)):
            args = _guard_str_method(obj, args, kwargs)
        return _check_size(super().call(context, obj, *args, **kwargs), "call result")

    def call_binop(self, context: Any, operator: str, left: Any, right: Any) -> Any:
        _budget()
        _check_all((left, right), f"{operator} operands")
        ints = [isinstance(x, int) and not isinstance(x, bool) for x in (left, right)]
        if operator == "*":
            if all(ints):
                if left.bit_length() + right.bit_length() > MAX_INT_BITS:
                    raise TemplateError("chat template integer product is too large")
            elif ints[0] or ints[1]:
                seq, n = (right, left) if ints[0] else (left, right)
                if isinstance(seq, (list, tuple)) and len(seq) * n > MAX_ELEMENTS:
                    raise TemplateError(f"chat template repetition would make more than {MAX_ELEMENTS} items")
                _refuse_if(_size(seq) * max(n, 0), "repetition")
        elif operator == "**" and all(ints) and right > 0 and abs(left) > 1:
            if right * left.bit_length() > MAX_INT_BITS:
                raise TemplateError("chat template power is too large")
        elif operator == "%" and isinstance(left, (str, bytes)):
            _check_printf(left, right)
        elif operator == "+":
            _refuse_if(_size(left) + _size(right), "concatenation")
        return _check_size(super().call_binop(context, operator, left, right), "operator result")

    def wrap_str_format(self, value: Any) -> Any:
        inner = super().wrap_str_format(value)
        if inner is None:
            return None
        fmt = value.__self__
        is_map = value.__name__ == "format_map"

        @functools.wraps(inner)
        def guarded(*args: Any, **kwargs: Any) -> str:
            _budget()
            _check_format_spec(fmt, args, args[0] if is_map and args and isinstance(args[0], Mapping) else kwargs)
            return _check_size(inner(*args, **kwargs), "format() result")

        return guarded


class ChatTemplate:
    """A compiled chat template; `render()` may be called concurrently from several threads."""

    def __init__(self, source: str | None, *, time_limit: float = RENDER_SECONDS):
        if source is not None and not isinstance(source, str):
            raise TemplateError(f"chat template must be a string, got {type(source).__name__}")
        if source is None or not source.strip():
            source = CHATML_TEMPLATE
        if len(source.encode("utf-8", "surrogateescape")) > MAX_TEMPLATE_BYTES:
            raise TemplateError(f"chat template is larger than {MAX_TEMPLATE_BYTES} bytes")
        self.time_limit = time_limit
        env = _GuardedEnvironment()
        try:
            tree = _Rewrite().visit(env.parse(source))
            tree.set_environment(env)
            self._template = env.from_string(tree)
        except TemplateError:
            raise
        except jinja2.TemplateSyntaxError as e:
            raise TemplateError(f"chat template syntax error (line {e.lineno}): {e.message}") from None
        except (RecursionError, MemoryError):
            raise TemplateError("chat template is nested too deeply") from None
        except Exception as e:
            raise TemplateError(f"chat template does not compile: {type(e).__name__}: {e}") from None

    def render(self, messages: list[dict], add_generation_prompt: bool = True, bos_token: str = "",
               eos_token: str = "", **extra: Any) -> str:
        if not isinstance(messages, list) or not all(isinstance(m, Mapping) for m in messages):
            raise TemplateError("messages must be a list of dicts (role, content)")
        context = {"tools": None, **extra, "messages": messages, "add_generation_prompt": add_generation_prompt,
                   "bos_token": bos_token, "eos_token": eos_token}
        token = _BUDGET.set(_Budget(self.time_limit))
        try:
            parts: list[str] = []
            size = 0
            for chunk in self._template.generate(context):
                _budget()
                size += len(chunk)
                if size > MAX_SIZE:
                    raise TemplateError(f"chat template output exceeds {MAX_SIZE} characters")
                parts.append(chunk)
            return "".join(parts)
        except TemplateError:
            raise
        except jinja2.exceptions.SecurityError as e:
            raise TemplateError(f"chat template blocked by the sandbox: {e}") from None
        except RecursionError:
            raise TemplateError("chat template recursed too deeply") from None
        except MemoryError:
            raise TemplateError("chat template ran out of memory") from None
        except Exception as e:
            raise TemplateError(f"chat template failed: {type(e).__name__}: {e}") from None
        finally:
            _BUDGET.reset(token)


@functools.lru_cache(maxsize=16)
def _compiled(source: str | None) -> ChatTemplate:
    return ChatTemplate(source)


def render_chat(template: str | None, messages: list[dict], add_generation_prompt: bool = True,
                bos_token: str = "", eos_token: str = "", **extra: Any) -> str:
    """Render `messages` with a chat template (ChatML when `template` is None or empty).

    `extra` becomes template variables (e.g. `tools`, `enable_thinking`). Raises TemplateError
    for a bad or hostile template, or one that exceeds the limits in this module's docstring.
    """
    if template is not None and not isinstance(template, str):
        raise TemplateError(f"chat template must be a string, got {type(template).__name__}")
    return _compiled(template).render(messages, add_generation_prompt=add_generation_prompt,
                                      bos_token=bos_token, eos_token=eos_token, **extra)
