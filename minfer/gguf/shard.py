"""A per-rank view of a GGUF file: the same metadata, some tensors cut to this rank's slice.

Tensor parallelism (docs/ARCHITECTURE.md, "Tensor parallelism") gives every rank a part of
each large matrix. `ShardedReader` presents that part under the tensor's own name, with its
shape in GGUF order, so a model's graph and a backend's weight loading read a shard exactly as
they read a whole file:

- a slice of rows (GGUF axis 1: a column-parallel q/k/v/gate/up, a vocab-parallel embedding or
  output) is one contiguous byte range of the file: a zero-copy view of the memory map;
- a slice inside every row (GGUF axis 0: the K-split of a row-parallel attn_output/ffn_down)
  keeps whole quant blocks of each row, so it must start and stop on a block boundary; its
  bytes are gathered row by row into memory of the shard's size (only those bytes are read);
- a 1-D tensor (a bias) is sliced like one row.

Either way a rank reads and holds about 1/world of a split tensor's bytes.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from ..errors import ParallelError
from ..quant.types import quant_info
from .reader import GGUFReader, TensorInfo

BY_ROWS, IN_ROW = 1, 0  # GGUF axes: ne1 = rows (the output dim), ne0 = elements inside a row


@dataclass(frozen=True)
class TensorSlice:
    """Elements [start, stop) of GGUF axis `axis` (1: rows, 0: inside each row)."""

    axis: int
    start: int
    stop: int


class ShardedReader:
    """`reader` with the tensors of `slices` cut to their slice. Metadata, path and every other
    tensor are the reader's. ParallelError for a slice outside its tensor or one that cuts a
    quant block."""

    def __init__(self, reader: GGUFReader, slices: dict[str, TensorSlice]):
        self.base = reader
        self.slices = dict(slices)
        self.tensors: dict[str, TensorInfo] = dict(reader.tensors)
        for name, s in self.slices.items():
            self.tensors[name] = _sliced_info(reader.tensor_info(name), s)

    def __getattr__(self, attr: str):  # metadata, path, get_int, close ...: the file's own
        return getattr(self.base, attr)

    def tensor_info(self, name: str) -> TensorInfo:
        if name in self.slices:
            return self.tensors[name]
        return self.base.tensor_info(name)

    def tensor_bytes(self, name: str) -> np.ndarray:
        """uint8 bytes of this rank's part of the tensor (a view of the map when contiguous)."""
        s = self.slices.get(name)
        if s is None:
            return self.base.tensor_bytes(name)
        full_info = self.base.tensor_info(name)
        full = self.base.tensor_bytes(name)
        q = quant_info(full_info.ggml_type)
        if s.axis == BY_ROWS:
            row = full_info.nbytes // full_info.shape[1]
            return full[s.start * row:s.stop * row]
        rows = full_info.nbytes // _row_bytes(full_info)
        b0, b1 = q.nbytes(s.start), q.nbytes(s.stop)
        part = full.reshape(rows, -1)[:, b0:b1]
        return part.reshape(-1) if rows == 1 else np.ascontiguousarray(part).reshape(-1)

    def close(self) -> None:
        self.base.close()


def _row_bytes(info: TensorInfo) -> int:
    return quant_info(info.ggml_type).nbytes(info.shape[0])


def _sliced_info(info: TensorInfo, s: TensorSlice) -> TensorInfo:
    q = quant_info(info.ggml_type)
    if s.axis not in (BY_ROWS, IN_ROW) or s.axis >= len(info.shape) or len(info.shape) > 2:
        raise ParallelError(f"tensor {info.name!r} of shape {list(info.shape)}: cannot slice GGUF axis {s.axis}")
    n = info.shape[s.axis]
    if not 0 <= s.start < s.stop <= n:
        raise ParallelError(f"tensor {info.name!r}: slice {s.start}..{s.stop} of axis {s.axis} is outside 0..{n}")
    shape = list(info.shape)
    shape[s.axis] = s.stop - s.start
    if s.axis == IN_ROW:
        if s.start % q.block_elems or s.stop % q.block_elems:
            raise ParallelError(
                f"tensor {info.name!r} ({info.ggml_type.name}, blocks of {q.block_elems}): cutting each row to "
                f"columns {s.start}..{s.stop} would cut a quant block; this --tp does not divide the model into whole "
                "blocks (use a smaller --tp)")
        offset = info.offset + q.nbytes(s.start)  # where the first row's part starts
    else:
        offset = info.offset + s.start * (info.nbytes // info.shape[1])
    n_elems = int(np.prod(shape))
    return replace(info, shape=tuple(shape), offset=offset, nbytes=q.nbytes(n_elems), n_elems=n_elems)
