"""Weight preparation for the cpu backend: GGUF tensor bytes -> the forms torch computes with fast.

A MatMul weight becomes a `Matrix`, prepared once at load, that prefill and decode rows share:

- Q4_0, Q4_1, Q4_K, Q5_0, Q5_1, Q5_K, Q6_K, Q8_0 and the lookup types IQ4_NL, IQ4_XS, MXFP4, where the C
  kernel can run (AVX512-VNNI or AVX2, a C compiler): the VNNI form (minfer/kernels/cpu/vnni.py), int8
  activations per 32 in two passes for decode rows (the contracts `cpu_q4_vnni2`, `cpu_q5_vnni2`,
  `cpu_q6k_vnni2`, `cpu_q8_vnni2`, `cpu_iq4_vnni2`, `cpu_mxfp4_vnni2`), in one for prompt chunks where
  the type has a one-pass kernel (`cpu_q4_vnni`, `cpu_q8_vnni`; EngineConfig.cpu_prompt_passes = 2: two).
- every other quantized type (and all of them elsewhere) runs torch's int4 packed matmul (group
  size 32, bfloat16 activations and scales) on the type's int4 digits (minfer/kernels/cpu/matmul.py):
  4-bit types as they are (0.63 bytes per weight), the others as lo/hi digit pairs (1.25 bytes per
  weight). No float copy of a quantized weight is made; the file's pages of a packed tensor are
  released.
- F32 and BF16 weights are the file's bytes (float32 / bfloat16 GEMM); F16 gets a float32 copy.

The int4 path returns the kernel's own bfloat16 result and takes bfloat16 input as it is: a
step's activations stay bfloat16 from one int4 matmul to the next (SwiGLU between gate/up and
down), and float32 consumers promote them (the residual Add, the KV cache copy, RoPE).
The bfloat16 scales and activations cost ~0.3% relative error per matmul (llama.cpp's 8-bit
activations cost about as much); tests/engine/test_cpu_weights.py checks every type against the
`gguf` package's dequantizer in float64.

`dense_f32` (and `Matrix.dense`) decode the exact float32 values by `quant.reference.dequantize`
(bit-exact with gguf.quants): the numerical reference, computed on demand, never kept.
"""

from __future__ import annotations

import functools
import math
import re
from pathlib import Path

import torch

from ...contracts.picker import Candidate, candidates
from ...contracts.registry import backend_registry
from ...errors import NoKernelError, UnsupportedError
from ...gguf.reader import GGUFReader, TensorInfo
from ...kernels.cpu import vnni as cpu_vnni
from ...kernels.cpu.matmul import INT4_TYPES, Int4Matmul, _Linear, float_weight, pack_weight, packed_bytes
from ...quant.reference import dequantize
from ...quant.types import QUANT_TABLE, GGMLType
from .weight_cache import WeightCache


@functools.cache
def native_bf16() -> bool:
    """Whether this CPU has bfloat16 dot-product instructions (AVX512-BF16 or AMX)."""
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    return bool(re.search(r"\b(avx512_bf16|amx_bf16)\b", flags))


def raw_rows(reader: GGUFReader, info: TensorInfo) -> torch.Tensor:
    """The tensor's bytes as uint8 [rows, row_bytes] (zero-copy view of the file; a vector is one
    row, whatever its type)."""
    rows = info.torch_shape[0] if len(info.shape) > 1 else 1
    return torch.from_numpy(reader.tensor_bytes(info.name)).view(rows, -1)


def decode_rows(rows: torch.Tensor, qtype: GGMLType, width: int) -> torch.Tensor:
    """Exact float32 [n, width] of raw rows [n, row_bytes], by the reference dequantizer."""
    return dequantize(rows, qtype, (rows.shape[0], width))


def dense_f32(reader: GGUFReader, info: TensorInfo) -> torch.Tensor:
    """The exact float32 values of a weight, in torch order."""
    if len(info.shape) == 1:
        return decode_rows(raw_rows(reader, info).view(1, -1), info.ggml_type, info.shape[0]).view(-1)
    rows = raw_rows(reader, info).view(math.prod(info.torch_shape[:-1]), -1)  # a 3-D tensor: E * N rows
    return decode_rows(rows, info.ggml_type, info.torch_shape[-1]).view(info.torch_shape)


# the C kernels (kernels/cpu/vnni.fkc.md): prompt chunks (activations in one int8 pass) -> decode
# rows (the same weights, two passes)
VNNI_DECODE = {"cpu_q4_vnni": "cpu_q4_vnni2", "cpu_q8_vnni": "cpu_q8_vnni2"}
# (the lookup types: two passes only)
VNNI_KERNELS = set(VNNI_DECODE) | set(VNNI_DECODE.values()) | {"cpu_q5_vnni2", "cpu_q6k_vnni2", "cpu_iq4_vnni2",
                                                              "cpu_mxfp4_vnni2"}
MOE_VNNI = "cpu_vnni2_moe"  # the chosen experts of a VNNI type in one call (kernels/cpu/vnni.fkc.md)


@functools.lru_cache(maxsize=1024)  # every layer asks for the same few shapes
def pick_kernel(qtype: GGMLType, n: int, k: int, rows: int = 1, decode: bool = False, vnni: bool = True) -> Candidate:
    """The cpu kernel contract for a matmul by an [n, k] weight of this type over `rows` rows of
    a prompt chunk (or, `decode`, of decode rows), as the picker ranks them
    (minfer/kernels/cpu/matmul.fkc.md, cpu/vnni.fkc.md); `vnni`: the C kernels may run (the CPU has
    the instructions, a compiler built them, the configuration allows them)."""
    info = QUANT_TABLE[qtype]
    ok, rejected = candidates("QMatMul", {"x": "F32", "w": info.contract_name},
                              {"x": (rows, k), "w": (n, k // info.block_elems * info.block_bytes)},
                              {"n": n, "k": k, "qtype": qtype}, "CPU",
                              registry=backend_registry("CPU"))  # the CPU contract files alone: no GPU kernel imported
    if not (vnni and cpu_vnni.available()):  # the VNNI kernels need the CPU's instructions and a C compiler
        ok = [c for c in ok if c.kernel.contract.kernel_source != "c"]
    # decode rows take the two-pass variants (memory-bound: the second pass costs no time); prompt
    # chunks the one-pass ones where a type has one (llama.cpp's int8 activations: its greedy
    # answers on the default model, at 1.7x the two-pass speed on an 8B's prompts)
    ok = [c for c in ok if c.kernel.name not in (VNNI_DECODE if decode else VNNI_DECODE.values())]
    if not ok:
        raise NoKernelError(f"cpu backend: no kernel contract multiplies by a {qtype.name} [{n}, {k}] weight; "
                            f"nearest: " + "; ".join(f"{r.name}: {', '.join(why)}" for r, why in rejected[:3]))
    return ok[0]


@functools.lru_cache(maxsize=256)
def expert_kernel(qtype: GGMLType, n: int, k: int, n_expert: int, vnni: bool = True) -> str:
    """The cpu kernel of an expert tensor (n_expert matrices [n, k]): the grouped VNNI contract
    (`cpu_vnni2_moe`) where it takes the type and the C kernels run, else the QMatMul kernel each
    chosen expert runs on (torch's int4 form, a float GEMM)."""
    ok, _ = candidates("MoEMatMul", {"x": "F32", "ids": "I32", "w": QUANT_TABLE[qtype].contract_name},
                       {"x": (1, k), "ids": (1, 1), "w": (n_expert * n, k)},
                       {"n": n, "k": k, "qtype": qtype, "n_expert": n_expert}, "CPU", registry=backend_registry("CPU"))
    if ok and vnni and cpu_vnni.available():
        return ok[0].kernel.name
    return pick_kernel(qtype, n, k, vnni=False).kernel.name


def prepared_bytes(info: TensorInfo, vnni: bool = True) -> int:
    """Memory a matrix of this tensor takes once prepared (before preparing it); a 3-D expert
    tensor: its E matrices (each padded to the kernel's tile)."""
    if len(info.shape) == 3:
        e, n, k = info.torch_shape
        if expert_kernel(info.ggml_type, n, k, e, vnni) == MOE_VNNI:
            return e * cpu_vnni.packed_bytes(n + -n % cpu_vnni.COLS, k, info.ggml_type)
        return e * prepared_bytes(TensorInfo(info.name, (k, n), info.ggml_type, 0, info.nbytes // e, n * k), vnni)
    n, k = info.torch_shape
    if pick_kernel(info.ggml_type, n, k, vnni=vnni).kernel.name in VNNI_KERNELS:
        return cpu_vnni.packed_bytes(n, k, info.ggml_type)
    if info.ggml_type in INT4_TYPES:
        return packed_bytes(n, k, info.ggml_type)
    return n * k * (4 if info.ggml_type == GGMLType.F16 else info.nbytes // (n * k))


def kernel_name(qtype: GGMLType, n: int = 64, k: int = 256, vnni: bool = True) -> str:
    """The kernel contract a weight of this type runs on (prefill and decode alike)."""
    return pick_kernel(qtype, n, k, vnni=vnni).kernel.name


class Matrix:
    """y = x @ W^T (+ b) for one prepared weight W [n, k] (a fused weight: its parts' rows stacked).

    Every quantized type runs torch's int4 packed matmul on the type's int4 digits (minfer/kernels/cpu/matmul.py),
    prefill and decode rows alike: no float copy of a quantized weight exists. Stacked parts of
    different families (a Q4_K_M file's Q4_K q/k with a Q6_K v) run one kernel per run of parts
    and their columns are concatenated. Every output row depends on its input row alone."""

    def __init__(self, reader: GGUFReader, infos: list[TensorInfo], bias: torch.Tensor | None, vnni: bool = True,
                 cache: WeightCache | None = None, prompt_passes: int = 1):
        """`cache`: where the prepared forms come from (and go to) across loads (weight_cache.py);
        `prompt_passes`: a prompt's int8 activation passes on the VNNI kernels (2: the decode rows'
        kernels for prompts too; EngineConfig.cpu_prompt_passes)."""
        self._cache = cache
        self._parts = (reader, infos)
        self.vnni = vnni
        self.bias = bias
        self.n, self.k = sum(i.torch_shape[0] for i in infos), infos[0].torch_shape[1]
        self._runs: list[tuple[str, object]] = []
        # each part's kernel, as the contracts choose it; consecutive parts on the same kernel
        # are packed together (one call)
        names = [pick_kernel(i.ggml_type, *i.torch_shape, decode=prompt_passes == 2, vnni=vnni).kernel.name
                 for i in infos]
        self._decode_names = tuple(dict.fromkeys(
            pick_kernel(i.ggml_type, *i.torch_shape, decode=True, vnni=vnni).kernel.name for i in infos))
        run: list[TensorInfo] = []
        passes: list[int] = []  # a prompt's activation passes on each run (one where the type has a one-pass kernel)
        for j, info in enumerate(infos + [None]):
            if run and (info is None or names[j] != names[j - 1]):
                self._runs.append(self._prepare(reader, run))
                passes.append(1 if names[j - 1] in VNNI_DECODE else 2)
                run = []
            if info is not None:
                run.append(info)
        self.kernels = tuple(dict.fromkeys(names))
        self.prefill_passes = tuple(passes)
        self.nbytes = sum(fn.nbytes for _, fn in self._runs)

    def _prepare(self, reader: GGUFReader, infos: list[TensorInfo]) -> tuple[str, object]:
        vnni = pick_kernel(infos[0].ggml_type, *infos[0].torch_shape, vnni=self.vnni).kernel.name in VNNI_KERNELS
        if not vnni and infos[0].ggml_type not in INT4_TYPES:
            ws = [float_weight(raw_rows(reader, i), *i.torch_shape, i.ggml_type) for i in infos]
            return "linear", _Linear(ws[0] if len(ws) == 1 else torch.cat(ws))
        kind, cls = ("vnni", cpu_vnni.Q4Vnni) if vnni else ("int4", Int4Matmul)
        name = f"{kind}:" + ",".join(i.name for i in infos)
        cache = self._cache
        stored = cache.get(name) if cache is not None else None
        if stored is not None:
            return kind, cls.from_state(stored)
        if vnni:
            mm = cpu_vnni.Q4Vnni([(raw_rows(reader, i), i.ggml_type, *i.torch_shape) for i in infos])
        else:
            mm = Int4Matmul([pack_weight(raw_rows(reader, i), i.ggml_type, i.torch_shape[1]) for i in infos])
        for i in infos:
            reader.release(i.name)  # the file's pages of this tensor are no longer needed
        mapped = cache.put(name, mm.state()) if cache is not None else None
        return kind, (cls.from_state(mapped) if mapped is not None else mm)  # (mapped: the packed copy is freed)

    @property
    def dense(self) -> torch.Tensor:
        """The exact float32 weight [n, k], decoded on each access (tests and references only)."""
        reader, infos = self._parts
        parts = [dense_f32(reader, i) for i in infos]
        return parts[0].contiguous() if len(parts) == 1 else torch.cat(parts)

    def __call__(self, x: torch.Tensor, decode: bool = False, passes: int | None = None) -> torch.Tensor:
        """[T, n]: bfloat16 from the int4 kernels, float32 from a float32 GEMM (a bias promotes
        to float32). Decode and prefill rows take the same weights; `decode`: the VNNI kernels' two
        activation passes (prompts: one where the type has a one-pass kernel; `passes` overrides),
        and a float32 GEMM's rows one at a time (sgemm's rounding depends on the row count)."""
        if not x.shape[0]:  # (a prompt chunk whose logits nobody asked: the output matmul gets no rows)
            return torch.zeros(0, self.n, dtype=torch.float32)
        ps = (passes,) * len(self._runs) if passes else self.passes(decode)
        ys = [fn(x, decode) if kind == "linear" else fn(x, p) if kind == "vnni" else fn(x)
              for (kind, fn), p in zip(self._runs, ps, strict=True)]
        y = ys[0] if len(ys) == 1 else torch.cat([t.to(ys[0].dtype) for t in ys], dim=1)
        return y if self.bias is None else y + self.bias

    def passes(self, decode: bool) -> tuple[int, ...]:
        """Each run's int8 activation passes on a VNNI kernel: two for decode rows, a prompt's as its kernel says."""
        return (2,) * len(self._runs) if decode else self.prefill_passes

    def direct(self) -> tuple[str, object] | None:
        """(kind, kernel) of the one quantized kernel ("int4": call(x); "vnni": call(x, passes))
        this matrix is, when it has no bias and no parts on other kernels (the backend calls it
        without this wrapper), else None."""
        if self.bias is None and len(self._runs) == 1 and self._runs[0][0] != "linear":
            return self._runs[0]
        return None

    def kernel(self, decode: bool = False) -> str:
        return "+".join(self._decode_names if decode else self.kernels)


class Experts:
    """The E matrices [N, K] of a 3-D expert tensor (GGUF shape [K, N, E]), prepared once at load
    on the kernel the contracts choose for one expert's [N, K] (as `Matrix` does for a 2-D weight),
    and run on the chosen experts only: `__call__(x, ids, decode)` -> y [T, k, N] with y[t, j] =
    x's row @ W[ids[t, j]]^T. The VNNI form holds every expert in one packed tensor, each starting
    on a tile boundary (`Q4Vnni(aligned=True)`), so an expert's columns run alone; torch's int4 form
    and float weights keep one matrix per expert. Every decode row depends on its input row and
    its expert alone (the quantized kernels' rows never depend on the others'; float weights run
    decode rows one at a time, `_Linear`); a prompt's float rows share one sgemm per expert."""

    def __init__(self, reader: GGUFReader, info: TensorInfo, vnni: bool = True, cache: WeightCache | None = None):
        self.e, self.n, self.k = info.torch_shape
        self.qtype = info.ggml_type
        self._parts = (reader, info)
        self.kernel = expert_kernel(self.qtype, self.n, self.k, self.e, vnni)
        raw = raw_rows(reader, info).view(self.e * self.n, -1)
        rows = [raw[i * self.n:(i + 1) * self.n] for i in range(self.e)]
        name = f"{self.kernel}:{info.name}"
        stored = cache.get(name) if cache is not None else None
        self.vnni = self.kernel == MOE_VNNI
        if self.vnni:
            self.stride = self.n + -self.n % cpu_vnni.COLS
            if stored is not None:
                self.mm = cpu_vnni.Q4Vnni.from_state(stored)
            else:
                self.mm = cpu_vnni.vnni_experts(raw, self.n, self.k, self.qtype, self.e)
                mapped = cache.put(name, self.mm.state()) if cache is not None else None
                if mapped is not None:  # continue from the file's map: the packed copy is freed
                    self.mm = cpu_vnni.Q4Vnni.from_state(mapped)
            self.nbytes = self.mm.nbytes
        elif self.qtype in INT4_TYPES:
            self.mms = []
            for i, r in enumerate(rows):
                st = cache.get(f"{name}#{i}") if cache is not None else None
                mm = Int4Matmul.from_state(st) if st is not None else Int4Matmul([pack_weight(r, self.qtype, self.k)])
                mapped = cache.put(f"{name}#{i}", mm.state()) if st is None and cache is not None else None
                self.mms.append(Int4Matmul.from_state(mapped) if mapped is not None else mm)
            self.nbytes = sum(m.nbytes for m in self.mms)
        else:
            self.mms = [_Linear(float_weight(r, self.n, self.k, self.qtype)) for r in rows]
            self.nbytes = sum(m.nbytes for m in self.mms)
        if self.vnni or self.qtype in INT4_TYPES:
            reader.release(info.name)  # the file's pages of this tensor are no longer needed

    def expert(self, e: int, x: torch.Tensor, decode: bool = True) -> torch.Tensor:
        """x [m, K] @ W[e]^T: [m, N] (float32, or the int4 kernel's bfloat16)."""
        if self.vnni:
            return self.mm.run_cols(x, e * self.stride, self.n, passes=2)
        mm = self.mms[e]
        return mm(x, decode) if isinstance(mm, _Linear) else mm(x)

    def __call__(self, x: torch.Tensor, ids: torch.Tensor, decode: bool = True) -> torch.Tensor:
        """y [T, k, N] float32: x [T, K] feeds every chosen expert of its row, x [T, k, K] slot j
        feeds expert ids[t, j]. Rows are grouped by expert: the VNNI form runs them in one C call
        (threads across experts, kernels/cpu/vnni.fkc.md cpu_vnni2_moe), the others one kernel
        call per expert chosen."""
        if self.vnni:
            return self.mm.run_experts(x, ids, self.n, self.e, passes=2)
        return self.per_expert(x, ids, decode)

    def per_expert(self, x: torch.Tensor, ids: torch.Tensor, decode: bool = True) -> torch.Tensor:
        """__call__ by one kernel call per expert chosen (the reference path of the grouped call)."""
        t, used = ids.shape
        flat = ids.reshape(-1).long()
        if flat.numel() and not (0 <= int(flat.min()) and int(flat.max()) < self.e):
            raise UnsupportedError(f"experts: ids must be in 0..{self.e - 1}, got {flat.min()}..{flat.max()}")
        xs = x.reshape(t * used, self.k) if x.dim() == 3 else x
        out = torch.empty(t * used, self.n)
        order = torch.argsort(flat, stable=True)
        experts, counts = torch.unique_consecutive(flat[order], return_counts=True)
        at = 0
        for e, c in zip(experts.tolist(), counts.tolist(), strict=True):
            slots = order[at:at + c]
            at += c
            rows = xs.index_select(0, slots if x.dim() == 3 else slots // used)
            out.index_copy_(0, slots, self.expert(e, rows, decode).float())
        return out.view(t, used, self.n)

    @property
    def dense(self) -> torch.Tensor:
        """The exact float32 weights [E, N, K], decoded on each access (tests and references only)."""
        reader, info = self._parts
        return dense_f32(reader, info)


class EmbeddingTable:
    """GetRows from a weight: gathers the raw rows of the requested ids, then decodes only those."""

    def __init__(self, reader: GGUFReader, info: TensorInfo):
        self.qtype = info.ggml_type
        self.width = info.torch_shape[-1]
        self.raw = raw_rows(reader, info)
        # the C decoder where it runs and takes the type (the reference's bits; a decode step's row in ~1 us)
        self.native = cpu_vnni.available() and self.qtype in cpu_vnni.EMBED_TYPES  # (raw_rows: contiguous)

    def __call__(self, ids: torch.Tensor) -> torch.Tensor:
        if self.native:
            return cpu_vnni.embed_rows(self.raw, self.qtype, ids, self.width)
        return decode_rows(self.raw.index_select(0, ids.long()), self.qtype, self.width)

    def into(self, ids: torch.Tensor, out: torch.Tensor) -> None:
        """The rows of `ids` written into `out` (float32 [len(ids), width], contiguous)."""
        if self.native:
            cpu_vnni.embed_rows(self.raw, self.qtype, ids, self.width, out=out)
        else:
            out.copy_(self(ids))
