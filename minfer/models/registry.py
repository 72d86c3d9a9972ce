"""Architectures by `general.architecture`, and the check that a file holds what a graph reads.

Adding an architecture: one model file with `from_gguf(reader) -> Args`, `check_args(args, reader)`
(hyperparameters bounded and matched against the tensors, before anything is built) and
`build_graph(args, part=None) -> Graph`, one row in ARCHITECTURES, one parity test case. Tensor
parallelism adds `partition(args, rank, world)` and `tensor_slices(args, part)` (`build_shard`).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..errors import ModelError, UnsupportedError
from ..gguf.reader import GGUFReader
from ..gguf.shard import ShardedReader
from ..graph.ir import Graph
from . import gemma, gpt_oss, llama, phi3, qwen2, qwen3, qwen3moe


@dataclass(frozen=True)
class Architecture:
    name: str
    from_gguf: Callable[[GGUFReader], Any]
    check_args: Callable[[Any, GGUFReader], None]
    build_graph: Callable[..., Graph]  # (args, part=None)
    partition: Callable[[Any, int, int], Any] | None = None  # (args, rank, world) -> a Partition
    tensor_slices: Callable[[Any, Any], dict] | None = None  # (args, part) -> name -> TensorSlice


ARCHITECTURES: dict[str, Architecture] = {
    a.name: a
    for a in [
        Architecture("llama", llama.from_gguf, llama.check_args, llama.build_graph,
                     llama.partition, llama.tensor_slices),
        Architecture("qwen2", qwen2.from_gguf, llama.check_args, qwen2.build_graph,
                     llama.partition, llama.tensor_slices),
        Architecture("qwen3", qwen3.from_gguf, qwen3.check_args, qwen3.build_graph,
                     llama.partition, llama.tensor_slices),
        Architecture("qwen3moe", qwen3moe.from_gguf, qwen3moe.check_args, qwen3moe.build_graph),
        Architecture("gemma2", gemma.GemmaArgs.from_gguf, gemma.check_args, gemma.build_graph),
        Architecture("gemma3", gemma.GemmaArgs.from_gguf, gemma.check_args, gemma.build_graph),
        Architecture("phi3", phi3.from_gguf, phi3.check_args, phi3.build_graph),
        Architecture("gpt-oss", gpt_oss.from_gguf, gpt_oss.check_args, gpt_oss.build_graph),
    ]
}


def architecture(name: str) -> Architecture:
    try:
        return ARCHITECTURES[name]
    except KeyError:
        raise UnsupportedError(
            f"architecture {name!r} is not supported; supported: {', '.join(sorted(ARCHITECTURES))}"
        ) from None


def build(reader: GGUFReader) -> tuple[Any, Graph]:
    """Args and graph of the model in `reader`, after checking every tensor the graph reads."""
    arch = architecture(reader.get_str("general.architecture"))
    args = arch.from_gguf(reader)
    arch.check_args(args, reader)  # bounded and consistent with the tensors before anything is built
    graph = arch.build_graph(args)
    check_tensors(graph, reader, arch.name)
    return args, graph


def build_shard(reader: GGUFReader, rank: int, world: int) -> tuple[Any, Graph, ShardedReader]:
    """Rank `rank` of `world` (tensor parallelism): the whole model's Args, this rank's graph, and
    the view of the file that holds this rank's part of every split tensor (gguf/shard.py)."""
    arch = architecture(reader.get_str("general.architecture"))
    if arch.partition is None or arch.tensor_slices is None:
        raise UnsupportedError(f"architecture {arch.name!r} has no tensor-parallel split")
    args = arch.from_gguf(reader)
    arch.check_args(args, reader)
    part = arch.partition(args, rank, world)
    view = ShardedReader(reader, arch.tensor_slices(args, part))
    graph = arch.build_graph(args, part)
    check_tensors(graph, view, arch.name)
    return args, graph, view


def check_split(reader: GGUFReader, world: int) -> None:
    """ParallelError (or the model's own error) now, before any rank starts, when the model in
    `reader` cannot be split over `world` ranks: every rank's partition and tensor slices."""
    arch = architecture(reader.get_str("general.architecture"))
    if arch.partition is None or arch.tensor_slices is None:
        raise UnsupportedError(f"architecture {arch.name!r} has no tensor-parallel split")
    args = arch.from_gguf(reader)
    arch.check_args(args, reader)
    for rank in range(world):
        ShardedReader(reader, arch.tensor_slices(args, arch.partition(args, rank, world)))


def _pattern(names) -> list[str]:
    """Weight names with layer numbers folded: blk.0.attn_q.weight, blk.1... -> blk.N.attn_q.weight."""
    return sorted({re.sub(r"^blk\.\d+\.", "blk.N.", n) for n in names})


def check_tensors(graph: Graph, reader: GGUFReader, arch: str) -> None:
    """ModelError naming the first missing or mis-shaped tensor and listing what `arch` needs."""
    for ref in graph.weights.values():
        info = reader.tensors.get(ref.name)
        if info is None:
            raise ModelError(f"tensor {ref.name!r} is missing from {reader.path.name}; the {arch} "
                             f"architecture needs: {', '.join(_pattern(graph.weights))}")
        if tuple(info.shape) != ref.shape:
            raise ModelError(f"tensor {ref.name!r} has shape {list(info.shape)} (GGUF order), but the "
                             f"metadata makes {arch} expect {list(ref.shape)}")
