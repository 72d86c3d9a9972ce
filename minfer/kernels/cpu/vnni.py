"""int4 weights x int8 activations in C (q4_vnni.c), through ctypes.

The C file is compiled once per machine and ISA with the system C compiler (`cc`, or $CC) into
minfer's cache directory ($MINFER_CACHE, else ~/.cache/minfer; cbuild.py) and loaded after torch, so its
OpenMP regions run on torch's own libgomp threads. One source, four builds (`ISAS`): "amx" (the
avx512 build whose prompt products, 32 rows and more, run on the AMX tile unit: Intel Xeon since
Sapphire Rapids, where the kernel grants the process the tile state; opt-in, OPT_IN), "avx512"
(AVX512-VNNI), "avxvnni" (AVX2 with the 256-bit AVX-VNNI dot product: Intel client CPUs since
Alder Lake) and "avx2" (AVX2 + FMA + F16C: AMD Zen 2/3, older Intel) — the AVX2 builds model each
512-bit register as two 256-bit halves with the same float operations in the same order, so every
build gives the same bits. `use_isa` picks one ("auto": the best the CPU's flags allow, OPT_IN aside; the
backend passes EngineConfig.cpu_isa, MINFER_CPU_ISA); `isa()` says which runs. `available()` says
whether any can run here (the ISA's CPU flags and a compiler; MINFER_CPU_VNNI=0 turns the backend's
use off). Where none can, the cpu backend keeps torch's int4 kernel for every type
(kernels/cpu/matmul.py).
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import re
from pathlib import Path

import torch

from ...errors import UnsupportedError
from ...quant.types import GGMLType, quant_info
from ..cbuild import build
from .matmul import into, rows_call

SOURCE = Path(__file__).parent / "q4_vnni.c"
REVISION_SOURCES = (SOURCE,)  # the contract's revision hash covers the C file
FLAGS = ["-O3", "-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512vnni", "-mf16c", "-mfma", "-fopenmp"]
# ISA -> (the /proc/cpuinfo flags it needs, its compiler flags), best first (the order "auto" tries)
AMX_FLAGS = [*FLAGS, "-mamx-tile", "-mamx-int8", "-DMINFER_AMX"]
ISAS = {
    "amx": ({"avx512f", "avx512bw", "avx512vl", "avx512_vnni", "f16c", "fma", "amx_tile", "amx_int8"}, AMX_FLAGS),
    "avx512": ({"avx512f", "avx512bw", "avx512vl", "avx512_vnni", "f16c", "fma"}, FLAGS),
    "avxvnni": ({"avx2", "avx_vnni", "f16c", "fma"},
                ["-O3", "-mavx2", "-mavxvnni", "-mf16c", "-mfma", "-DMINFER_AVX2", "-fopenmp"]),
    "avx2": ({"avx2", "f16c", "fma"}, ["-O3", "-mavx2", "-mf16c", "-mfma", "-DMINFER_AVX2", "-fopenmp"]),
}
# builds "auto" does not pick: amx's prompt products (an earlier form, 99cc752) ran 1.3-1.8x avx512's alone on
# the H200's 16-core Xeon on the widest shapes at 4-16 threads but 0.95x on a 896 x 4864 one; whole prompts with
# the form here (8 rows' sums in registers, the units a span of groups apart) ran 0.54-1.25x avx512 on two
# 16-core hosts (bench/NOTES.md stops 51, 53). It runs where asked (MINFER_CPU_ISA=amx).
OPT_IN = {"amx"}
# builds for the tests only (use_isa accepts them, "auto" never picks them): the amx build with its tile
# registers and instructions emulated in C (q4_vnni.c MINFER_AMX_EMULATE), so the AMX path's indexing and
# float order are checked against the avx512 bits on any AVX-512 machine; slow
TEST_ISAS = {"amx-emulated": (ISAS["avx512"][0], [*AMX_FLAGS, "-DMINFER_AMX_EMULATE"])}
_ISA = ["auto"]  # the requested build (use_isa)
TYPES = {GGMLType.Q4_0: 2, GGMLType.Q4_1: 3, GGMLType.Q4_K: 12}  # ggml type ids the packer reads: 4-bit codes
# the lookup types: 4-bit codes through a 16-byte table of their values + 128 (vpshufb)
LUT_TYPES = {GGMLType.IQ4_NL: 20, GGMLType.IQ4_XS: 23, GGMLType.MXFP4: 39}
TYPES8 = {GGMLType.Q8_0: 8}  # 8-bit codes: Q8_0 as q + 128 (zero -128 d)
# 5- and 6-bit codes: the 4-bit layout of their low bits + byte planes of the high bits (q56_pack)
TYPES5 = {GGMLType.Q5_0: 6, GGMLType.Q5_1: 7, GGMLType.Q5_K: 13}
TYPES6 = {GGMLType.Q6_K: 14}
# the K types packed with their own scales (q4_vnni.c's KM layout): per 16 columns and group of 32, the 6-bit
# scales and mins as bytes (SC, in `s`), per super-block of 256 the file's float16 d and dmin (D, in `z`): 0.578
# bytes a weight (4-bit) against 0.625 for a float16 scale and zero per 32, and the scales exact in float32
KM_TYPES = {GGMLType.Q4_K, GGMLType.Q5_K}
KM_FLAG = 256  # the `bits` argument's flag for that layout (q4_vnni.c KM_FLAG; the packers' qtype too)
# the symmetric types: zero = ZERO_MULT x scale, computed by the kernel, no Z stored (Q6_K: in integers)
ZERO_MULT = {GGMLType.Q4_0: -8.0, GGMLType.Q8_0: -128.0, GGMLType.Q5_0: -16.0, GGMLType.IQ4_NL: -128.0,
             GGMLType.IQ4_XS: -128.0, GGMLType.MXFP4: -128.0}
GROUP_BYTES = {4: 256, 5: 320, 6: 384, 8: 512}  # code bytes per 16 columns and group of 32, by code width
ALL_TYPES = (*TYPES, *TYPES5, *TYPES6, *TYPES8, *LUT_TYPES)  # every type the kernel reads
COLS = 32  # output columns are padded to a multiple of this (the kernel's tile)


def _cpu_flags() -> set[str]:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return set()
    m = re.search(r"^flags\s*:(.*)$", text, re.M)
    return set(m.group(1).split()) if m else set()


def use_isa(name: str) -> None:
    """Which build of the C kernels this process runs from now on: "auto" (the first of ISAS the
    CPU has, OPT_IN aside) or one of ISAS or TEST_ISAS (none runs where the CPU lacks it). Weights
    prepared before keep theirs."""
    if name != "auto" and name not in ISAS and name not in TEST_ISAS:
        raise UnsupportedError(f"cpu ISA {name!r}: expected auto or one of {', '.join(ISAS)}")
    _ISA[0] = name


@contextlib.contextmanager
def isa_forced(name: str):
    """`use_isa(name)` for a block (the choice before it afterwards); yields `isa()`: the build that
    runs, None where this CPU or compiler has none (tests run each build on an AVX-512 machine)."""
    before = _ISA[0]
    use_isa(name)
    try:
        yield isa()
    finally:
        use_isa(before)


def isa() -> str | None:
    """The build the C kernels run as (a key of ISAS), or None where none can run here."""
    return _resolve(_ISA[0])


@functools.cache
def _resolve(requested: str) -> str | None:
    names = [n for n in ISAS if n not in OPT_IN] if requested == "auto" else [requested]
    return next((n for n in names if _build(n) is not None), None)


def _library() -> ctypes.CDLL | None:
    """The compiled kernel of the chosen ISA (built on first use), or None where it cannot be built or run."""
    name = isa()
    return None if name is None else _build(name)


@functools.cache
def _build(name: str) -> ctypes.CDLL | None:
    """The kernel built for ISA `name`, or None where the CPU lacks it or it cannot be built."""
    need, flags = ISAS[name] if name in ISAS else TEST_ISAS[name]
    if not need <= _cpu_flags():
        return None
    so = build(SOURCE, flags, "using torch's int4 kernel")
    if so is None:
        return None
    if "-DMINFER_AMX" in flags and so.amx_init() != 1:  # the kernel did not grant the tile state (or an old kernel)
        return None
    p, i, f = ctypes.c_void_p, ctypes.c_int, ctypes.c_float
    for pack in (so.q4_pack, so.q8_pack, so.q56_pack):
        pack.argtypes = [p, i, i, i, i, p, p, p]
        pack.restype = i
    so.q4_gemm.argtypes = [p, p, p, f, i, i, p, i, i, p, i, i, i, p]
    so.q4_gemm.restype = i
    so.q4_gemm_experts.argtypes = [p, p, p, f, i, i, i, i, p, i, i, p, p, i, p, i, i, i, p]
    so.q4_gemm_experts.restype = i
    so.attn_decode.argtypes = [p, i, p, p, i, i, i, i, i, p, p, p, i, ctypes.c_float, ctypes.c_float, p, p]
    so.attn_decode.restype = i
    so.rope_f32.argtypes = [p, i, i, i, i, i, i, p, p, p]
    so.rope_f32.restype = i
    so.rms_norm.argtypes = [p, i, i, p, ctypes.c_float, p]
    so.rms_norm.restype = i
    so.glu_f32.argtypes = [i, p, i, p, i, i, i, p, i]
    so.glu_f32.restype = i
    so.prog_run.argtypes = [p, i, i, p, p, p, i, i, i]  # the decode program (backends/cpu/native.py)
    so.prog_run.restype = i
    so.prog_profile.argtypes = [p]  # (bench/studies/cpu_step_profile.py)
    so.prog_profile.restype = None
    so.argmax_rows.argtypes = [p, i, i, i, p]
    so.argmax_rows.restype = i
    so.embed_rows.argtypes = [p, ctypes.c_long, ctypes.c_long, i, p, i, i, p]
    so.embed_rows.restype = i
    return so


def available() -> bool:
    return _library() is not None


def _ptr(t: torch.Tensor) -> int:
    """The address the C kernels read or write: a host tensor's alone (a CUDA or meta tensor's address
    would be dereferenced on the host: a segfault, not an error)."""
    _on_host("the cpu C kernels", t)
    return t.data_ptr()


def _on_host(what: str, *ts: torch.Tensor | None) -> None:
    """A typed error unless every tensor given is in host memory: the C kernels read their addresses."""
    for t in ts:
        if t is not None and not t.is_cpu:
            raise UnsupportedError(f"{what} take host tensors, got one on {t.device}")


def lut_bytes(qtype: GGMLType) -> torch.Tensor | None:
    """The 16-byte table of a lookup type (its int8 values + 128, the unsigned bytes vpdpbusd takes;
    the zero -128 S restores them), None for the other types."""
    table = quant_info(qtype).lut
    return torch.tensor([v + 128 for v in table], dtype=torch.uint8) if table else None


def _code_kind(qtype: GGMLType) -> tuple[int, tuple[int, ...]]:
    """(bits per code, lookup table) of a type the kernel reads; (0, ()) for the others."""
    if qtype in TYPES8:
        return 8, ()
    if qtype in TYPES5:
        return 5, ()
    if qtype in TYPES6:
        return 6, ()
    if qtype in TYPES or qtype in LUT_TYPES:
        return 4, quant_info(qtype).lut
    return 0, ()


class Q4Vnni:
    """One weight [n, k] (or stacked weights of one code width and table) in the VNNI layout,
    prepared once at load: codes uint8 [n'/16, k/32, GROUP_BYTES[bits]] (4-bit types: two codes a
    byte; 5-, 6-bit: their low 4 bits so, then byte planes of the high bits; Q8_0: one byte each, q + 128)
    and float16 scales [n'/16, k/32, 16] (Q6_K: 32, one per 16 weights), n' = n rounded up to 32
    (zero columns); zeros [n'/16, k/32, 16] float16, or none where every part's zero is `zm` times
    its scale (ZERO_MULT: the symmetric types); the lookup types' 16-byte table `lut` (else None).
    Parts all Q4_K or all Q5_K (`km`, KM_TYPES) keep their own scales instead: `s` the 6-bit scales and
    mins as bytes [n'/16, k/32, 32], `z` the float16 d and dmin [n'/16, k/256, 32].
    `__call__(x)` is y = x @ W^T, float32 [m, n]."""

    def __init__(self, parts: list[tuple[torch.Tensor, GGMLType, int, int]], aligned: bool = False):
        """parts: (raw rows uint8 [n_i, row_bytes], type, n_i, k) stacked in this order; `aligned`:
        each part starts at a multiple of COLS columns (its own zero columns after it), so a part's
        columns can be run alone (`run_cols`: one expert of a 3-D expert tensor)."""
        so = _library()
        if so is None:
            raise UnsupportedError("the int8-activation VNNI kernel is not available on this machine")
        k = parts[0][3]
        if k % 32 or any(p[3] != k for p in parts):
            raise UnsupportedError(f"q4_vnni: k must be one multiple of 32 for every part, got {[p[3] for p in parts]}")
        kinds = {_code_kind(p[1]) for p in parts}
        if len(kinds) != 1 or (0, ()) in kinds:
            raise UnsupportedError(f"q4_vnni: {', '.join(p[1].name for p in parts)}: the parts must all be 4-bit "
                                   f"({', '.join(t.name for t in TYPES)}), all 5-bit "
                                   f"({', '.join(t.name for t in TYPES5)}), all Q6_K, all Q8_0 or all lookup "
                                   f"types of one table ({', '.join(t.name for t in LUT_TYPES)})")
        self.bits = kinds.pop()[0]
        self.lut = lut_bytes(parts[0][1])
        self.n, self.k = sum(p[2] for p in parts), k
        zms = {ZERO_MULT.get(p[1], 0.0) for p in parts}
        self.zm = zms.pop() if len(zms) == 1 else 0.0  # 0: zeros stored (Q6_K: none either way)
        self.km = all(p[1] == parts[0][1] for p in parts) and parts[0][1] in KM_TYPES
        n_pad = sum(p[2] + -p[2] % COLS for p in parts) if aligned else self.n + -self.n % COLS
        g = k // 32
        self.w = torch.zeros(n_pad // 16, g, GROUP_BYTES[self.bits], dtype=torch.uint8)  # 16 columns x 32 codes
        stored = self.zm == 0.0 and self.bits != 6
        if self.km:  # SC bytes [n'/16, k/32, 32], D float16 [n'/16, k/256, 32]
            self.s = torch.zeros(n_pad // 16, g, 32, dtype=torch.uint8)
            self.z = torch.zeros(n_pad // 16, g // 8, 32, dtype=torch.float16)
        else:
            self.s = torch.zeros(n_pad // 16, g, 32 if self.bits == 6 else 16, dtype=torch.float16)
            self.z = torch.zeros(n_pad // 16 if stored else 0, g, 16, dtype=torch.float16)
        at = 0
        for rows, qtype, n, _ in parts:
            rows = rows.contiguous()
            ptrs = (_ptr(self.w), _ptr(self.s), _ptr(self.z) if stored else None)
            info = quant_info(qtype)
            row_bytes = info.nbytes(k) if k % info.block_elems == 0 else None
            if rows.dtype != torch.uint8 or row_bytes is None or rows.shape != (n, row_bytes):
                raise UnsupportedError(f"q4_vnni: {qtype.name} rows must be uint8 [{n}, {row_bytes or '?'}] "
                                       f"(k a multiple of {info.block_elems}), got {rows.dtype} {list(rows.shape)}")
            pack, ids = ((so.q8_pack, TYPES8) if self.bits == 8 else (so.q56_pack, {**TYPES5, **TYPES6})
                         if self.bits in (5, 6) else (so.q4_pack, {**TYPES, **LUT_TYPES}))
            done = pack(_ptr(rows), ids[qtype] | (KM_FLAG if self.km else 0), n, k, at, *ptrs)
            if done == -3:
                raise UnsupportedError(f"q4_vnni: a {qtype.name} block scale of this weight (or 128 times it) is "
                                       "beyond float16's 65504, the largest the VNNI layout stores")
            if done != 0:
                raise UnsupportedError(f"q4_vnni: cannot pack {qtype.name}")
            at += n + (-n % COLS if aligned else 0)
        self.n_pad = n_pad
        self._bind(so)

    def _bind(self, so) -> None:
        self.nbytes = self.w.numel() + self.s.numel() * self.s.element_size() + 2 * self.z.numel()
        self.cbits = self.bits | (KM_FLAG if self.km else 0)  # the kernels' `bits` argument
        self._gemm = so.q4_gemm
        self._experts = so.q4_gemm_experts
        z = _ptr(self.z) if self.z.numel() else None
        self._ptrs = (_ptr(self.w), _ptr(self.s), z, self.zm, self.n_pad, self.k)
        self._lut = None if self.lut is None else _ptr(self.lut)

    def state(self) -> dict:
        """The prepared layout as tensors and numbers (backends/cpu/weight_cache.py keeps it on disk)."""
        st = {"w": self.w, "s": self.s, "z": self.z, "zm": self.zm, "n": self.n, "k": self.k, "bits": self.bits,
              "km": int(self.km),
              "n_pad": self.n_pad}
        if self.lut is not None:
            st["lut"] = self.lut
        return st

    @classmethod
    def from_state(cls, st: dict) -> Q4Vnni:
        """A Q4Vnni over tensors `state()` gave (e.g. memory-mapped from the cache): no packing."""
        so = _library()
        if so is None:
            raise UnsupportedError("the int8-activation VNNI kernel is not available on this machine")
        self = cls.__new__(cls)
        self.w, self.s, self.z = st["w"].contiguous(), st["s"].contiguous(), st["z"].contiguous()
        self.n, self.k, self.bits, self.n_pad = int(st["n"]), int(st["k"]), int(st["bits"]), int(st["n_pad"])
        self.zm = float(st["zm"])
        self.km = bool(int(st.get("km", 0)))
        self.lut = st["lut"].contiguous() if "lut" in st else None
        self._bind(so)
        return self

    def run_cols(self, x: torch.Tensor, col0: int, n: int, passes: int = 1) -> torch.Tensor:
        """y [m, n] float32 = x [m, k] @ W[col0:col0 + n]^T: columns col0.. alone (col0 a multiple
        of COLS, the columns up to the next multiple computed and dropped): one expert of an
        `aligned` expert tensor."""
        if col0 % COLS or not 0 <= col0 < col0 + n <= self.n_pad:
            raise UnsupportedError(f"q4_vnni: columns {col0}..{col0 + n} are not a run of whole tiles of "
                                   f"0..{self.n_pad}")
        width = n + -n % COLS
        g = self.k // 32
        t0 = col0 // 16  # first block of 16 columns
        w, s, z, zm = self._ptrs[:4]
        sb, zb = (t.shape[1] * t.shape[2] * t.element_size() for t in (self.s, self.z))  # bytes a block of 16
        ptrs = (w + t0 * g * self.w.shape[2], s + t0 * sb, z and z + t0 * zb, zm, width, self.k)
        return self._gemm_into(ptrs, x, passes)[:, :n]

    def _gemm_into(self, ptrs: tuple, x: torch.Tensor, passes: int) -> torch.Tensor:
        if x.dtype != torch.float32 and x.dtype != torch.bfloat16:
            x = x.float()
        if not x.is_contiguous():
            x = x.contiguous()
        m, width = x.shape[0], ptrs[4]
        if x.dim() != 2 or x.shape[1] != self.k or m < 1:
            raise UnsupportedError(f"q4_vnni: x must be [m >= 1, {self.k}], got {list(x.shape)}")
        _on_host("q4_vnni", x)
        y = torch.empty(m, width)
        rc = self._gemm(*ptrs, x.data_ptr(), x.dtype == torch.bfloat16, m, y.data_ptr(), width, passes, self.cbits,
                        self._lut)
        if rc == -2:
            raise MemoryError(f"q4_vnni: no memory for {m} x {self.k} quantized activations")
        if rc:
            raise UnsupportedError(f"q4_vnni: {passes} activation passes on [{m}, {self.k}] x [{width}, "
                                   f"{self.k}] is outside the kernel's contract")
        return y

    def run_experts(self, x: torch.Tensor, ids: torch.Tensor, n: int, n_expert: int, passes: int = 2) -> torch.Tensor:
        """y [T, k_used, n] float32 of an `aligned` stack of n_expert experts of n columns (x [T, k]:
        each row's x feeds its k_used experts; x [T, k_used, k]: one x per slot): the slots grouped
        by expert and one C call for all of them (q4_gemm_experts: the activations quantized once,
        threads across the experts' column tiles). A slot's numbers are `run_cols`'s for its row alone."""
        t, used = ids.shape
        stride = n + -n % COLS
        if self.n_pad != n_expert * stride or ids.dtype != torch.int32 or x.shape[-1] != self.k or x.shape[0] != t \
                or (x.dim() == 3 and x.shape[1] != used) or x.dim() not in (2, 3):
            raise UnsupportedError(f"q4_vnni experts: {n_expert} experts of {n} columns ({self.n_pad} packed), int32 "
                                   f"ids "
                                   f"[T, k] and x [T, {self.k}] or [T, k, {self.k}]; got ids {ids.dtype} "
                                   f"{list(ids.shape)}, x {list(x.shape)}")
        flat = ids.reshape(-1).long()
        if flat.numel() == 0:
            return torch.empty(t, used, n)
        order = torch.argsort(flat, stable=True)
        experts, counts = torch.unique_consecutive(flat[order], return_counts=True)
        if int(experts[0]) < 0 or int(experts[-1]) >= n_expert:
            raise UnsupportedError(f"q4_vnni experts: ids must be in 0..{n_expert - 1}, got {int(experts[0])}.."
                                   f"{int(experts[-1])}")
        src = x.reshape(t * used, self.k).index_select(0, order) if x.dim() == 3 else x.index_select(0, order // used)
        if src.dtype != torch.float32 and src.dtype != torch.bfloat16:
            src = src.float()
        src = src.contiguous()
        starts = torch.cat([counts.new_zeros(1), counts.cumsum(0)]).to(torch.int32)
        ex = experts.to(torch.int32)
        _on_host("q4_vnni experts", src, starts, ex)
        y = torch.empty(flat.numel(), stride)
        rc = self._experts(*self._ptrs[:4], stride, n, n_expert, self.k, src.data_ptr(),
                           src.dtype == torch.bfloat16, src.shape[0], starts.data_ptr(), ex.data_ptr(), ex.numel(),
                           y.data_ptr(), stride, passes, self.cbits, self._lut)
        if rc == -2:
            raise MemoryError(f"q4_vnni experts: no memory for {src.shape[0]} x {self.k} quantized activations")
        if rc:
            raise UnsupportedError(f"q4_vnni experts: {passes} activation passes on {src.shape[0]} rows of {self.k} "
                                   f"x {n_expert} experts of {n} is outside the kernel's contract")
        out = torch.empty(flat.numel(), n)
        out[order] = y[:, :n]
        return out.view(t, used, n)

    def __call__(self, x: torch.Tensor, passes: int = 1) -> torch.Tensor:
        """y [m, n] float32 = x [m, k] @ W^T (x float32 or bfloat16; anything else is converted),
        the activations in `passes` int8 quantizations (1: llama.cpp's Q8_0 scheme; 2: its
        rounding error quantized again, ~15 bits)."""
        y = self._gemm_into(self._ptrs, x, passes)
        return y if self.n_pad == self.n else y[:, :self.n]


def packed_bytes(n: int, k: int, qtype: GGMLType = GGMLType.Q4_0) -> int:
    """Bytes of a Q4Vnni weight [n, k] of one type: its codes (GROUP_BYTES per 16 columns and group
    of 32) and float16 scales (Q6_K: two a group) and zeros (none for the symmetric types); the K types
    (KM_TYPES) a byte of scale and one of min per column and group, two float16 per column and 256."""
    n_pad, g = n + -n % COLS, k // 32
    bits = _code_kind(qtype)[0]
    if qtype in KM_TYPES:
        return n_pad // 16 * g * GROUP_BYTES[bits] + n_pad * g * 2 + n_pad * (g // 8) * 4
    halves = (2 if bits == 6 else 1) + (0 if bits == 6 or qtype in ZERO_MULT else 1)  # float16 per column and group
    return n_pad // 16 * g * GROUP_BYTES[bits] + n_pad * g * 2 * halves


# ---- the launchers the kernel contract binds (minfer/kernels/cpu/matmul.fkc.md) ----


def q4_vnni_weight(w: torch.Tensor, n: int, k: int, qtype: GGMLType | int | str) -> Q4Vnni:
    """Load layout: a weight's raw bytes (a type of ALL_TYPES) -> its VNNI form."""
    if isinstance(w, Q4Vnni):
        return w
    from .matmul import _qinfo

    info = _qinfo(qtype)
    if _code_kind(info.type)[0] == 0:
        raise UnsupportedError(f"q4_vnni_weight: {info.name} is not one of "
                               f"{', '.join(t.name for t in ALL_TYPES)}")
    if k % info.block_elems or w.dtype != torch.uint8 or w.numel() != info.nbytes(n * k):
        raise UnsupportedError(f"q4_vnni_weight: expected the uint8 bytes of a [{n}, {k}] {info.name} weight "
                               f"(k a multiple of {info.block_elems}), got {w.dtype} x {w.numel()}")
    return Q4Vnni([(w.reshape(n, -1), info.type, n, k)])


def q4_vnni_mm(x: torch.Tensor, w, n: int, k: int, qtype: GGMLType | int | str,
               out: torch.Tensor | None = None, passes: int = 1) -> torch.Tensor:
    """out [m, n] float32 = x [m, k] @ W^T on W's VNNI form (`q4_vnni_weight`; raw bytes are
    packed on every call: correct, but a full pass over W each time), activations in one int8
    pass (cpu_q4_vnni)."""
    mm = q4_vnni_weight(w, n, k, qtype)
    return rows_call("q4_vnni_mm", x, k, lambda x2: mm(x2, passes), out)


def vnni_experts(w: torch.Tensor, n: int, k: int, qtype: GGMLType | int | str, n_expert: int) -> Q4Vnni:
    """Load layout: a 3-D expert tensor's raw bytes (n_expert matrices [n, k] of a VNNI type) -> one
    VNNI form with each expert on a tile boundary (`Q4Vnni(aligned=True)`)."""
    if isinstance(w, Q4Vnni):
        return w
    from .matmul import _qinfo

    info = _qinfo(qtype)
    if info.type not in ALL_TYPES:
        raise UnsupportedError(f"vnni_experts: {info.name} is not one of {', '.join(t.name for t in ALL_TYPES)}")
    if k % info.block_elems or w.dtype != torch.uint8 or w.numel() != n_expert * info.nbytes(n * k):
        raise UnsupportedError(f"vnni_experts: expected the uint8 bytes of {n_expert} [{n}, {k}] {info.name} experts "
                               f"(k a multiple of {info.block_elems}), got {w.dtype} x {w.numel()}")
    rows = w.reshape(n_expert * n, -1)
    return Q4Vnni([(rows[e * n:(e + 1) * n], info.type, n, k) for e in range(n_expert)], aligned=True)


def vnni2_experts_mm(x: torch.Tensor, ids: torch.Tensor, w, n: int, k: int, qtype: GGMLType | int | str,
                     n_expert: int, out: torch.Tensor | None = None) -> torch.Tensor:
    """out [T, k_used, n] float32: slot (t, j) = x[t] (or x[t, j]) @ expert ids[t, j]'s matrix, on the
    VNNI form of every expert (`vnni_experts`; raw bytes are packed per call), activations in two
    int8 passes, the slots grouped by expert in one call (cpu_vnni2_moe)."""
    mm = vnni_experts(w, n, k, qtype, n_expert)
    return into("vnni2_experts_mm", mm.run_experts(x, ids, n, n_expert, passes=2), out)


def attention_fits(n_head: int, n_kv: int, head_dim: int) -> bool:
    """Whether attention_decode takes these sizes (head_dim a multiple of 16 up to 256, at most 16
    query heads per kv head)."""
    return head_dim % 16 == 0 and head_dim <= 256 and n_head % n_kv == 0 and n_head // n_kv <= 16


ATTN_CHUNK = 128  # q4_vnni.c's CHUNK: keys per attention task (a row's keys split by its own length only)
ATTN_SCRATCH = 64 << 20  # bytes of partial results one attn_decode call may hold; more rows go in several calls


def _attn_row_groups(lens: list[int], starts: list[int] | None, n_kv: int, task_bytes: int) -> list[tuple[int, int]]:
    """[r0, r1) row ranges whose attn_decode scratch (n_kv tasks per ATTN_CHUNK keys of each row, task_bytes
    each) stays within ATTN_SCRATCH (one row at least): a long prompt chunk at a deep position would
    otherwise allocate gigabytes (512 rows x 8 kv heads x 256 chunks at 32k)."""
    groups, r0, used = [], 0, 0
    for r, n in enumerate(lens):
        size = n_kv * -(-(n - (starts[r] if starts is not None else 0)) // ATTN_CHUNK) * task_bytes
        if r > r0 and used + size > ATTN_SCRATCH:
            groups.append((r0, r))
            r0, used = r, 0
        used += size
    groups.append((r0, len(lens)))
    return groups


def attention_decode(q: torch.Tensor, k_layer: torch.Tensor, v_layer: torch.Tensor, slots: torch.Tensor,
                     lens: torch.Tensor, n_head: int, scale: float, starts: torch.Tensor | None = None,
                     softcap: float = 0.0, sinks: torch.Tensor | None = None) -> torch.Tensor:
    """One query row per sequence over its cached keys (q4_vnni.c attn_decode): q [B, n_head * hd]
    float32 (rows may be strided), a layer's cache k/v [n_slots, n_kv, n_ctx, hd] float32, row b
    attending positions starts[b]..lens[b]-1 (starts None: from 0; a sliding window's first key)
    of slot slots[b] (int32 [B]); `softcap` > 0: scores become softcap tanh(s / softcap); `sinks`
    [n_head]: each head's logit as one more softmax column (ops.attention_masked's meaning).
    Returns [B, n_head * hd]. A row's result does not depend on the other rows."""
    so = _library()
    n_slots, n_kv, n_ctx, hd = k_layer.shape
    rows = q.shape[0]
    if q.stride(1) != 1 or q.dtype != torch.float32:
        q = q.float().contiguous()
    if sinks is not None:
        sinks = sinks.float().contiguous()
    if (q.shape[1] != n_head * hd or v_layer.shape != k_layer.shape or not k_layer.is_contiguous()
            or not v_layer.is_contiguous() or slots.dtype != torch.int32 or lens.dtype != torch.int32
            or slots.shape != (rows,) or lens.shape != (rows,) or not slots.is_contiguous()
            or not lens.is_contiguous()
            or (starts is not None and (starts.dtype != torch.int32 or starts.shape != (rows,)
                                        or not starts.is_contiguous()))
            or (sinks is not None and sinks.shape != (n_head,))):
        raise UnsupportedError(f"attn_decode: q [B, {n_head} * {hd}], contiguous k/v caches of one shape, int32 "
                               f"slots/lens/starts [B] and sinks [{n_head}]; got q {list(q.shape)}, k "
                               f"{list(k_layer.shape)}, v {list(v_layer.shape)}, slots {slots.dtype} "
                               f"{list(slots.shape)}, lens {lens.dtype} {list(lens.shape)}"
                               + ("" if starts is None else f", starts {starts.dtype} {list(starts.shape)}")
                               + ("" if sinks is None else f", sinks {list(sinks.shape)}"))
    _on_host("attn_decode", q, k_layer, v_layer, slots, lens, starts, sinks)
    out = torch.empty(rows, n_head * hd)
    task_bytes = 4 * (n_head // max(1, n_kv)) * (hd + 2)
    whole = rows * n_kv * -(-n_ctx // ATTN_CHUNK) * task_bytes <= ATTN_SCRATCH  # (any lengths: one call)
    groups = [(0, rows)] if whole else _attn_row_groups(lens.tolist(), None if starts is None else starts.tolist(),
                                                        n_kv, task_bytes)
    for r0, r1 in groups:  # (a row's result does not depend on the rows of its call: the same bits in groups)
        if so.attn_decode(q.data_ptr() + 4 * r0 * q.stride(0), q.stride(0), k_layer.data_ptr(), v_layer.data_ptr(),
                          n_slots, n_kv, n_ctx, hd, n_head, slots.data_ptr() + 4 * r0,
                          None if starts is None else starts.data_ptr() + 4 * r0, lens.data_ptr() + 4 * r0, r1 - r0,
                          scale, softcap, None if sinks is None else sinks.data_ptr(),
                          out.data_ptr() + 4 * r0 * n_head * hd):
            raise UnsupportedError(f"attn_decode: head_dim {hd} (a multiple of 16 up to 256) and {n_head} query "
                               f"heads over {n_kv} kv heads (at most 16 per kv head), every slot in 0..{n_slots - 1} "
                               f"and length in 1..{n_ctx} (each start below its length), a finite soft-cap >= 0, "
                               "or no memory")
    return out


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cache_k: torch.Tensor, cache_v: torch.Tensor,
              row_slots: torch.Tensor, positions: torch.Tensor, layer: int, n_head: int, n_head_kv: int,
              head_dim: int, scale: float, spans=None, tiles=None, out: torch.Tensor | None = None,
              window: int = 0, softcap: float = 0.0, sinks: torch.Tensor | None = None) -> torch.Tensor:
    """The Attention op on the C kernel (contract `cpu_attention`): each row's k, v written at (slot, position)
    of the layer's float32 cache [layers, slots, n_head_kv, n_ctx, head_dim], then `attention_decode` of its q
    over positions 0..position of its slot (the last `window` of them where window > 0; scores soft-capped
    where softcap > 0; `sinks` [n_head] one more softmax column each). Prompt rows are decode rows at their
    positions (a row's keys are the step's and the cache's below it). `spans` / `tiles` (the GPU kernels'
    host-side tables) are not used. The cpu backend calls attention_decode itself (its KV write is a step of
    its own); this is the op's form the contract checks."""
    what = "cpu_attention"
    if (cache_k.dim() != 5 or cache_v.shape != cache_k.shape or cache_k.dtype != torch.float32
            or cache_v.dtype != torch.float32 or not cache_k.is_contiguous() or not cache_v.is_contiguous()
            or cache_k.shape[2] != n_head_kv or cache_k.shape[4] != head_dim or not 0 <= layer < cache_k.shape[0]):
        raise UnsupportedError(f"{what}: contiguous float32 caches [layers, slots, {n_head_kv}, n_ctx, {head_dim}] "
                               f"with layer {layer} in them, got {cache_k.dtype} {list(cache_k.shape)} / "
                               f"{cache_v.dtype} {list(cache_v.shape)}")
    rows = q.shape[0]
    if (q.shape != (rows, n_head * head_dim) or k.shape != (rows, n_head_kv * head_dim) or v.shape != k.shape
            or row_slots.shape != (rows,) or positions.shape != (rows,) or row_slots.dtype != torch.int32
            or positions.dtype != torch.int32):
        raise UnsupportedError(f"{what}: q [{rows}, {n_head} * {head_dim}], k and v [{rows}, {n_head_kv} * "
                               f"{head_dim}], int32 row_slots and positions [{rows}]; got q {list(q.shape)}, k "
                               f"{list(k.shape)}, v {list(v.shape)}, row_slots {row_slots.dtype} "
                               f"{list(row_slots.shape)}, positions {positions.dtype} {list(positions.shape)}")
    if not attention_fits(n_head, n_head_kv, head_dim) or window < 0:
        raise UnsupportedError(f"{what}: head_dim {head_dim} (a multiple of 16 up to 256), {n_head} query heads "
                               f"over {n_head_kv} kv heads (at most 16 each), window {window} >= 0")
    n_slots, n_ctx = cache_k.shape[1], cache_k.shape[3]
    if rows and (int(row_slots.min()) < 0 or int(row_slots.max()) >= n_slots or int(positions.min()) < 0
                 or int(positions.max()) >= n_ctx):
        raise UnsupportedError(f"{what}: every slot in 0..{n_slots - 1} and position in 0..{n_ctx - 1}")
    if out is None:
        out = torch.empty(rows, n_head * head_dim)
    elif out.dtype != torch.float32 or out.shape != (rows, n_head * head_dim) or not out.is_contiguous():
        raise UnsupportedError(f"{what}: out must be contiguous float32 [{rows}, {n_head * head_dim}], got "
                               f"{out.dtype} {list(out.shape)}")
    if not rows:
        return out
    slots, pos = row_slots.long(), positions.long()
    cache_k[layer][slots, :, pos] = k.reshape(rows, n_head_kv, head_dim).float()
    cache_v[layer][slots, :, pos] = v.reshape(rows, n_head_kv, head_dim).float()
    lens = (positions + 1).contiguous()
    starts = (lens - window).clamp_(min=0).contiguous() if window else None
    out.copy_(attention_decode(q.float(), cache_k[layer], cache_v[layer], row_slots.contiguous(), lens, n_head,
                               scale, starts, softcap, sinks))
    return out


def q4_vnni2_mm(x: torch.Tensor, w, n: int, k: int, qtype: GGMLType | int | str,
                out: torch.Tensor | None = None) -> torch.Tensor:
    """q4_vnni_mm with the activations in two int8 passes (cpu_q4_vnni2: decode rows)."""
    return q4_vnni_mm(x, w, n, k, qtype, out, passes=2)


def rms_norm(x: torch.Tensor, w: torch.Tensor, eps: float, out: torch.Tensor | None = None,
             group: int | None = None) -> torch.Tensor:
    """x / sqrt(mean(x^2) + eps) * w over the rows of a float32 [m, d] or [d] (q4_vnni.c rms_norm, 16 lanes
    then a row's tail; contract `cpu_rms_norm`): one call, each row on its own. `group`: each run
    of `group` values of a row normed on its own, w [group] (the per-head q / k norms). `out`: its result
    copied there (float32 of x's shape); else a new tensor of x's shape."""
    shape = x.shape
    if x.dim() not in (1, 2) or shape[-1] < 1 or (group and shape[-1] % group):
        raise UnsupportedError(f"rms_norm: x [d] or [rows, d], rows of at least one value, d a multiple of group "
                               f"{group}; got {list(shape)}")
    x = x.reshape(-1, group or shape[-1])
    if not x.is_contiguous():
        x = x.contiguous()
    m, d = x.shape
    if w.shape != (d,) or w.dtype != torch.float32 or not w.is_contiguous() or x.dtype != torch.float32:
        raise UnsupportedError(f"rms_norm: float32 x [m, d] and w [d]; got x {x.dtype} {list(x.shape)}, w {w.dtype} "
                               f"{list(w.shape)}")
    _on_host("rms_norm", x, w)
    y = torch.empty(m, d)
    if _library().rms_norm(x.data_ptr(), m, d, w.data_ptr(), eps, y.data_ptr()):
        raise UnsupportedError(f"rms_norm: rows of at least one value, got {d}")
    y = y.view(shape)
    if out is None:
        return y
    if out.dtype != torch.float32 or out.shape != shape:
        raise UnsupportedError(f"rms_norm: out must be float32 {list(shape)}, got {out.dtype} {list(out.shape)}")
    return out.copy_(y)


def argmax_rows(x: torch.Tensor) -> torch.Tensor:
    """int32 [m]: each row's argmax of a float32 [m, n] host tensor (rows may be strided), as
    torch.argmax gives it (the first of equal maxima; a NaN counts as the largest), in C (q4_vnni.c
    argmax_rows; contract `cpu_argmax_rows`): torch's took ~0.1 ms a row of 151,936 logits here and
    ~0.37 ms on the H200's 16-core host, a few % of a small model's decode token (bench/NOTES.md, stop 43)."""
    if x.dim() != 2 or x.dtype != torch.float32 or (x.stride(1) != 1 and x.shape[1] > 1) or x.shape[1] < 1:
        raise UnsupportedError(f"argmax_rows: float32 [m, n >= 1] rows of unit stride, got {x.dtype} "
                               f"{list(x.shape)}")
    _on_host("argmax_rows", x)
    out = torch.empty(x.shape[0], dtype=torch.int32)
    ld = x.stride(0) if x.shape[0] > 1 else x.shape[1]  # (a single row's stride may be anything)
    if x.shape[0] and _library().argmax_rows(x.data_ptr(), x.shape[0], x.shape[1], ld, out.data_ptr()):
        raise UnsupportedError(f"argmax_rows: rows of {x.shape[1]} values, stride {x.stride(0)}")
    return out


# the types embed_rows decodes (q4_vnni.c embed_rows): every value a code times a float16 scale (+ a float16 min)
EMBED_TYPES = frozenset({GGMLType.F32, GGMLType.F16, GGMLType.BF16, GGMLType.Q4_0, GGMLType.Q4_1, GGMLType.Q5_0,
                         GGMLType.Q5_1, GGMLType.Q8_0})


def embed_rows(weight_u8: torch.Tensor, qtype: GGMLType | int, ids: torch.Tensor, n_embd: int,
               out: torch.Tensor | None = None) -> torch.Tensor:
    """float32 [n_ids, n_embd]: rows `ids` of the [n_rows, n_embd] table stored as `qtype` in `weight_u8`
    (contiguous uint8, a whole number of rows: the file's bytes), decoded in C (q4_vnni.c embed_rows; contract
    `cpu_embed_rows`) with the bits of quant/reference.py's dequantize, for the EMBED_TYPES: a decode step's
    token embedding, where the reference's torch ops took 50-100 us a row (bench/NOTES.md, stop 51). `ids`:
    integer ids, any shape (flattened). `out`: where to write (float32 [n_ids, n_embd], contiguous). Typed
    errors: another type, rows of another size, an id outside the rows (IndexError, as a gather's)."""
    info = quant_info(qtype)
    if info.type not in EMBED_TYPES:
        raise UnsupportedError(f"embed_rows: {info.name} is not one of {sorted(t.name for t in EMBED_TYPES)}")
    row_bytes = info.nbytes(n_embd) if n_embd % info.block_elems == 0 else 0
    if (weight_u8.dtype != torch.uint8 or not weight_u8.is_contiguous() or not row_bytes
            or weight_u8.numel() % row_bytes):
        raise UnsupportedError(f"embed_rows: the table must be contiguous uint8 of whole rows of {n_embd} "
                               f"{info.name} values, got {weight_u8.dtype} {list(weight_u8.shape)}")
    ids = ids.reshape(-1).to(torch.int32).contiguous()
    n_rows = weight_u8.numel() // row_bytes
    if out is None:
        out = torch.empty(ids.numel(), n_embd)
    elif out.dtype != torch.float32 or out.shape != (ids.numel(), n_embd) or not out.is_contiguous():
        raise UnsupportedError(f"embed_rows: out must be contiguous float32 [{ids.numel()}, {n_embd}], got "
                               f"{out.dtype} {list(out.shape)}")
    _on_host("embed_rows", weight_u8, ids, out)
    rc = _library().embed_rows(weight_u8.data_ptr(), n_rows, row_bytes, int(info.type), ids.data_ptr(), ids.numel(),
                               n_embd, out.data_ptr()) if ids.numel() else 0
    if rc == -2:
        bad = ids[(ids < 0) | (ids >= n_rows)][0].item()
        raise IndexError(f"embed_rows: row {bad} outside 0..{n_rows - 1}")
    if rc:
        raise UnsupportedError(f"embed_rows: rows of {row_bytes} bytes are not {n_embd} {info.name} values")
    return out


GLU_KINDS = {"swiglu": 0, "geglu": 1}  # q4_vnni.c glu_f32's kinds: silu, gelu_tanh


def _glu(what: str, gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """act(gate) * up of float32 tensors of one shape (2-D rows may be column views: rows strided), in C
    (q4_vnni.c glu_f32; the decode program's GLU steps are the same code): a new tensor."""
    if gate.dtype != torch.float32 or up.dtype != torch.float32 or gate.shape != up.shape or gate.dim() < 1:
        raise UnsupportedError(f"{what}: float32 gate and up of one shape, got {gate.dtype} {list(gate.shape)} / "
                               f"{up.dtype} {list(up.shape)}")
    shape = gate.shape
    if gate.dim() != 2 or gate.stride(1) != 1 or up.stride(1) != 1:
        gate, up = gate.reshape(-1, shape[-1]).contiguous(), up.reshape(-1, shape[-1]).contiguous()
    _on_host(what, gate, up)
    m, n = gate.shape
    out = torch.empty(m, n)
    if m and n and _library().glu_f32(GLU_KINDS[what], gate.data_ptr(), gate.stride(0), up.data_ptr(), up.stride(0),
                                      m, n, out.data_ptr(), n):
        raise UnsupportedError(f"{what}: [{m}, {n}] with row strides {gate.stride(0)} / {up.stride(0)}")
    return out.view(shape)


def swiglu(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """silu(gate) * up (`_glu`): g sigmoid(g) u, the sigmoid from exp_neg (cpu_swiglu)."""
    return _glu("swiglu", gate, up)


def geglu(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """gelu_tanh(gate) * up (`_glu`): g sigmoid(2a) u, a = sqrt(2 / pi) (g + 0.044715 g^3) (cpu_geglu)."""
    return _glu("geglu", gate, up)


def norm_fits(x_dtype: torch.dtype, d: int) -> bool:
    return x_dtype == torch.float32 and d % 16 == 0


def rope_at(x: torch.Tensor, positions: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, n_heads: int,
            head_dim: int, n_rot: int, neox: bool, out: torch.Tensor | None = None) -> torch.Tensor:
    """The RoPE op on the C kernel (contract `cpu_rope`): `rope` with each row's cos / sin taken from the
    tables [n_ctx, n_rot / 2] at its position (int32 [rows], each in 0..n_ctx - 1). `out`: the result copied
    there (float32 [rows, n_heads * head_dim])."""
    if positions.dim() != 1 or positions.shape[0] != x.shape[0] or positions.dtype not in (torch.int32, torch.int64):
        raise UnsupportedError(f"rope: integer positions [{x.shape[0]}], got {positions.dtype} {list(positions.shape)}")
    if x.shape[0] and (int(positions.min()) < 0 or int(positions.max()) >= cos.shape[0]):
        raise UnsupportedError(f"rope: positions in 0..{cos.shape[0] - 1} (the tables' rows)")
    pos = positions.long()
    y = rope(x, cos[pos], sin[pos], n_heads, head_dim, n_rot, neox)
    if out is None:
        return y
    if out.dtype != torch.float32 or out.shape != y.shape:
        raise UnsupportedError(f"rope: out must be float32 {list(y.shape)}, got {out.dtype} {list(out.shape)}")
    return out.copy_(y)


def rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, n_heads: int, head_dim: int, n_rot: int,
         neox: bool) -> torch.Tensor:
    """x [T, n_heads * head_dim] float32 (rows may be strided: a column view) rotated by the tokens'
    cos / sin [T, n_rot / 2] float32 (q4_vnni.c rope_f32; backends/cpu/ops.py apply_rope's meaning):
    a new contiguous [T, n_heads * head_dim]."""
    t = x.shape[0]
    if x.dtype != torch.float32 or x.dim() != 2 or x.stride(1) != 1 or x.shape[1] != n_heads * head_dim:
        x = x.float().contiguous().view(t, n_heads * head_dim)
    cos, sin = cos.float().contiguous(), sin.float().contiguous()
    if cos.shape != (t, n_rot // 2) or sin.shape != cos.shape:
        raise UnsupportedError(f"rope: cos / sin [{t}, {n_rot // 2}], got {list(cos.shape)} / {list(sin.shape)}")
    _on_host("rope", x, cos, sin)
    out = torch.empty(t, n_heads * head_dim)
    if t and _library().rope_f32(x.data_ptr(), x.stride(0), t, n_heads, head_dim, n_rot, int(neox), cos.data_ptr(),
                                 sin.data_ptr(), out.data_ptr()):
        raise UnsupportedError(f"rope: {n_heads} heads of {head_dim} with {n_rot} rotated dims (even, <= head_dim)")
    return out
