"""What the contract-driven compiler (compile.py) and the op table (bindings.py) speak: a node's
`Call` of its op for the picker, the `Way` a node runs (one of a backend's kinds), the `Launch`es a
bound step makes and the `Bound` step itself, and an op's `Binding`."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ..contracts.registry import BoundKernel
from ..graph.ir import Node, WeightRef
from ..quant.types import GGMLType, quant_info

if TYPE_CHECKING:
    from .compile import Compiler

STRIDED = {"contiguous": False, "strided": True}  # an input that may be a row-strided view


@dataclass(frozen=True)
class Call:
    """How a node calls its op: everything the picker needs, as a function of the row count."""

    op: str
    dtypes: dict[str, str]
    shapes_of: Callable[[int], dict[str, tuple[int, ...]]]
    params: dict
    layouts_of: Callable[[int], dict | None] | None = None
    prefer_quantized: bool | None = None  # many-row matmuls: MINFER_MMQ's choice, None = by cost
    needs: frozenset[str] = frozenset()  # capabilities the kernel must declare (caps.also)

    def shapes(self, rows: int) -> dict[str, tuple[int, ...]]:
        return self.shapes_of(rows)

    def layouts(self, rows: int) -> dict | None:
        return self.layouts_of(rows) if self.layouts_of is not None else None

    def needing(self, *caps: str) -> Call:
        if not caps:
            return self
        return Call(self.op, self.dtypes, self.shapes_of, self.params, self.layouts_of, self.prefer_quantized,
                    self.needs | frozenset(caps))


@dataclass
class Launch:
    """One kernel a node launches in one way of running, and the call it was picked for."""

    call: Call
    kernel: BoundKernel


@dataclass
class Bound:
    """A node compiled for one way of running: its step function and the launches it makes."""

    fn: Callable
    launches: list[Launch] = field(default_factory=list)

    @property
    def name(self) -> str:
        return "+".join(launch.kernel.name for launch in self.launches) or "view"


@dataclass(frozen=True)
class Binding:
    """How the GPU backends call one op: its `call(compiler, node)` for the picker, and
    `bind(compiler, node, kernel, call, way)` -> the Bound step that launches `kernel`."""

    call: Callable[[Compiler, Node], Call | None]
    bind: Callable[[Compiler, Node, BoundKernel, Call, Way], Bound]


@dataclass(frozen=True)
class Way:
    """A way of running a node: its name (a `Runtime.kinds` key) and the rows kernels are picked for."""

    kind: str
    rows: int


def type_runs(w: WeightRef, type_of: Callable[[str], GGMLType],
              max_bytes: int | None = None) -> list[tuple[WeightRef, GGMLType, int, int]]:
    """A (fused) weight's parts grouped into runs of one storage type, as (weight of the run, its
    type, first output column, end column): one run unless the parts differ in type (a Q4_K_M
    file's Q4_K q, k and Q6_K v), each run then multiplied into its columns. With `max_bytes` (a
    device that binds at most that many bytes at once: lavapipe's 128 MiB against Gemma's 178 MB
    tied embedding) a run larger than that is cut into its parts, and a part larger than that
    into chunks of whole rows (WeightRef.rows)."""
    runs: list[list] = []
    col = 0
    for part in w.tensors:
        t = type_of(part.name)
        if runs and runs[-1][0] == t:
            runs[-1][1].append(part)
        else:
            runs.append([t, [part], col])
        col += part.shape[1]
    out = []
    for t, parts, start in runs:
        cols = sum(p.shape[1] for p in parts)
        row_bytes = quant_info(t).nbytes(w.shape[0])
        if max_bytes is None or cols * row_bytes <= max_bytes:
            ref = parts[0] if len(parts) == 1 else WeightRef("+".join(p.name for p in parts), (w.shape[0], cols),
                                                             tuple(parts))
            out.append((ref, t, start, start + cols))
            continue
        step = max(1, max_bytes // row_bytes)
        for part in parts:
            n = part.shape[1]
            for r0 in range(0, n, step):
                r1 = min(n, r0 + step)
                ref = part if (r0, r1) == (0, n) else WeightRef(f"{part.name}[{r0}:{r1}]", (w.shape[0], r1 - r0),
                                                                (part,), (r0, r1))
                out.append((ref, t, start + r0, start + r1))
            start += n
    return out
