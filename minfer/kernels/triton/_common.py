"""Launcher plumbing shared by the Triton kernel families, and the jit helpers they share.

Every launcher does three things in order (Triton-tutorial style, seed 000 §2.2): check its
invariants, allocate or take `out`, compute the grid and launch. The torch-only checks live in
kernels/checks.py (re-exported here); this module adds what needs Triton: `check_device` (the device the
kernels compile for: cuda, or cpu under the interpreter), `interpreting()`, PDL and the jit
helpers.

Programmatic dependent launch (PDL, Hopper and later): every kernel of a step is launched with
`**pdl_args()`, which lets the GPU start it while the kernel before it is still running. Each
kernel calls `release_next(PDL)` first and `release_late(PDL)` before its stores (the mode
picks which one lets its dependents start once all its programs reach it), and `wait_prior(PDL)`
before it reads anything an earlier kernel wrote and before its first store (a reused buffer
may still be read by the kernel before it); only reads of weights may come before the wait.
Every kernel of the chain waits, so a kernel whose wait returned sees the results of all
kernels before it. Off under the interpreter, before sm_90, and where the backend turns it off
(`configure_pdl`: EngineConfig.pdl, MINFER_NO_PDL=1).

Grids: totals are computed in Python ints (arbitrary precision, so the 64-bit arithmetic of
seed 000 §2.2 comes free) and checked against CUDA's grid limits instead of clamped: a grid that
does not fit is refused, not silently shrunk. Kernels index with int64 wherever
rows * blocks can pass 2^31.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence

import torch
import triton
import triton.language as tl

from ...errors import DeviceError, UnsupportedError
from ..checks import check_int, check_tensor, make_out, rows_view, same_device, view_as

__all__ = [  # the checks are re-exported: a Triton launcher imports its plumbing from here
    "cdiv", "check_device", "check_grid", "check_int", "check_tensor", "make_out", "rows_view", "view_as",
    "interpreting", "pdl_args", "as_in_graphs", "wait_prior", "release_next", "release_late", "grouped_tile",
    "cast_for", "f32_to_bf16_rne", "INTERPRETING", "tanh", "gelu_tanh",
]

MAX_GRID_X = 2**31 - 1  # CUDA grid limit on axis 0
MAX_GRID_YZ = 2**16 - 1  # CUDA grid limit on axes 1 and 2


def cdiv(a: int, b: int) -> int:
    """ceil(a / b) for non-negative ints."""
    return -(-a // b)


@triton.jit
def _probe():
    pass


def interpreting() -> bool:
    """True when Triton runs kernels in its CPU interpreter (TRITON_INTERPRET=1 at import).

    Decided by what `triton.jit` produced, so this module reads no environment variable.
    """
    return not isinstance(_probe, triton.runtime.JITFunction)


def _fix_interpreter_index() -> None:
    """Let the interpreter run loops over runtime bounds (`range(0, K, BLOCK)`) with numpy >= 2.4.

    Triton 3.6's interpreter holds scalar kernel arguments as 1-element arrays and turns them
    into Python ints with int(array), which numpy 2.4 refuses (triton-lang/triton#9171, fixed
    upstream after 3.6.0). This re-registers `tensor.__index__` the way the upstream fix does.
    Interpreter only; compiled kernels are untouched. Remove once triton > 3.6 is the floor.
    """
    from triton.runtime import interpreter

    original = interpreter._patch_lang_tensor
    if getattr(original, "minfer_index_fix", False):
        return

    def patched(tensor, scope):
        original(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.reshape(-1)[0]))

    patched.minfer_index_fix = True
    interpreter._patch_lang_tensor = patched


def _patch_lang_once_per_launch() -> None:
    """Stop the interpreter re-patching triton.language on every call of a nested @triton.jit helper.

    The interpreter maps tl's builtins to its own before a launch (`GridExecutor.__call__` ->
    `_patch_lang`, undone after) and again on *every* call of a device function inside the kernel
    (`InterpretedFunction.__call__`), each time walking tl, tl.core, tl.math and tl.tensor with
    inspect.getmembers: ~20-30 % of a GEMV's interpreted time (cProfile of the fused-GEMV conformance
    cases, 2026-12-03). When the running launch already patched every language module the helper can
    see, the repeat only re-sets what is set (the patches it adds are never undone, triton 3.6-3.7),
    so it is skipped; a helper that sees a module the kernel does not still patches it. Same outputs,
    bit for bit. Interpreter only; a triton without these hooks is left as it is.
    """
    import inspect
    import threading

    from triton.runtime import interpreter

    original_patch, executor = getattr(interpreter, "_patch_lang", None), getattr(interpreter, "GridExecutor", None)
    if (original_patch is None or executor is None or not hasattr(interpreter, "_LangPatchScope")
            or getattr(original_patch, "minfer_once", False)):
        return
    original_call, running = executor.__call__, threading.local()  # per thread: the launches running in it

    seen: dict = {}  # jit function -> the language modules its globals hold

    def languages(fn) -> list:
        if fn not in seen:
            seen[fn] = [v for v in fn.__globals__.values() if inspect.ismodule(v) and (v is tl or v is tl.core)]
        return seen[fn]

    def patch_lang(fn):
        stack = getattr(running, "stack", None)
        if stack and stack[-1] is not None and all(any(m is p for p in stack[-1]) for m in languages(fn)):
            return interpreter._LangPatchScope()  # (nothing to undo)
        scope = original_patch(fn)
        if stack and stack[-1] is None:  # the launch's own patch: what its helpers may skip
            stack[-1] = languages(fn)
        return scope

    def call(self, *args, **kwargs):
        stack = running.__dict__.setdefault("stack", [])
        stack.append(None)
        try:
            return original_call(self, *args, **kwargs)
        finally:
            stack.pop()

    patch_lang.minfer_once = True
    interpreter._patch_lang = patch_lang
    executor.__call__ = call
    original_builtin = getattr(interpreter, "_patch_builtin", None)
    if original_builtin is not None and hasattr(interpreter, "_patch_attr"):
        names: dict = {}  # module or class -> dir() of it: the names never change, only what they hold

        def patch_builtin(pkg, builder, scope):
            """`_patch_builtin` without inspect.getmembers' sorted (name, value) list on every launch."""
            for name in names.setdefault(pkg, dir(pkg)):
                member = getattr(pkg, name, None)
                if tl.core.is_builtin(member):
                    interpreter._patch_attr(pkg, name, member, builder, scope)

        interpreter._patch_builtin = patch_builtin
    original_np_dtype = getattr(interpreter, "_get_np_dtype", None)
    if original_np_dtype is not None:
        np_dtypes: dict = {}  # a scalar tl dtype -> its numpy dtype (the original builds a 19-entry dict a call)

        def get_np_dtype(tt_dtype):
            element = tt_dtype.element_ty if isinstance(tt_dtype, tl.block_type) else tt_dtype
            if isinstance(element, tl.pointer_type):
                return original_np_dtype(tt_dtype)
            if element not in np_dtypes:
                np_dtypes[element] = original_np_dtype(element)
            return np_dtypes[element]

        interpreter._get_np_dtype = get_np_dtype


if interpreting():
    _fix_interpreter_index()
    _patch_lang_once_per_launch()

_WANTED_DEVICE = "cpu" if interpreting() else "cuda"
_PDL_WANTED = [True]  # the cuda backend's setting (configure_pdl)
_PDL_ON: bool | None = None
# kernel kind -> 0 off, 1 release the next kernel late, 2 early; only kernels captured into a CUDA
# graph take PDL (eager prompt chunks are bound by the host's launches, not by gaps on the GPU).
# H200, bench/studies/pdl_study.py (bench/NOTES.md run 14), tg64 tok/s off / all early / all late / this:
# SmolLM2 1,212 / 1,489 / 1,367 / 1,467; Qwen2.5-7B 381 / 345 / 403 / 413; Llama-3-8B 243 / 305 / 332 / 338.
PDL_MODES = {"gemv": 1, "other": 2}
PDL_GRAPH_ONLY = True
_PDL_ARGS = {0: {"PDL": 0}, 1: {"PDL": 1, "launch_pdl": True}, 2: {"PDL": 2, "launch_pdl": True}}


def configure_pdl(wanted: bool) -> None:
    """The cuda backend's setting (EngineConfig.pdl): whether its kernels may use PDL where the GPU
    and Triton have it. A process runs one cuda backend's settings at a time."""
    global _PDL_ON
    if _PDL_WANTED[0] != bool(wanted):
        _PDL_WANTED[0], _PDL_ON = bool(wanted), None


def pdl_args(kind: str = "other") -> dict:
    """Launch keywords of programmatic dependent launch for a kernel of `kind` ("gemv" or
    "other"): {PDL: mode, launch_pdl: True} on an sm_90+ GPU with a Triton that has the option,
    else {PDL: 0}. Mode 2 releases the next kernel when this one starts, mode 1 when its main
    work is done (before its stores). Availability is decided once (per `configure_pdl`)."""
    global _PDL_ON
    if _PDL_ON is None:
        on = False
        if not interpreting() and _PDL_WANTED[0] and torch.cuda.is_available():
            from triton.backends.nvidia.compiler import CUDAOptions

            on = torch.cuda.get_device_capability()[0] >= 9 and "launch_pdl" in CUDAOptions.__dataclass_fields__
        _PDL_ON = on
    if not _PDL_ON or (PDL_GRAPH_ONLY and not _AS_IN_GRAPHS[0] and not torch.cuda.is_current_stream_capturing()):
        return _PDL_ARGS[0]
    return _PDL_ARGS[PDL_MODES[kind]]


_AS_IN_GRAPHS = [False]


@contextlib.contextmanager
def as_in_graphs():
    """Launch as inside a CUDA graph capture: the warm-up runs before a capture compile the
    kernel variants the capture launches (nothing compiles while a stream is captured)."""
    _AS_IN_GRAPHS[0] = True
    try:
        yield
    finally:
        _AS_IN_GRAPHS[0] = False


def check_grid(what: str, grid: Sequence[int]) -> tuple[int, ...]:
    """The grid as a tuple, refused with UnsupportedError if an axis exceeds CUDA's limits."""
    limits = (MAX_GRID_X, MAX_GRID_YZ, MAX_GRID_YZ)
    for axis, (size, limit) in enumerate(zip(grid, limits, strict=False)):
        if size > limit:
            raise UnsupportedError(f"{what}: grid axis {axis} needs {size} programs; the limit is {limit}")
    return tuple(grid)


def check_device(what: str, **tensors: torch.Tensor | None) -> torch.device:
    """All tensors on one device, and one the Triton kernels can run on; returns that device.

    Compiled kernels need CUDA tensors; the interpreter (CI, no GPU) runs on CPU tensors. (Kernels
    written in torch check with `checks.same_device` alone: they run on any device.)
    """
    first = same_device(what, **tensors)
    if first.type != _WANTED_DEVICE:
        mode = "the Triton interpreter" if _WANTED_DEVICE == "cpu" else "compiled Triton kernels"
        raise DeviceError(f"{what}: {mode} need {_WANTED_DEVICE} tensors, got tensors on {first}")
    return first


# ---------------------------------------------------------------------------------------------
# jit helpers


INTERPRETING = tl.constexpr(interpreting())


@triton.jit
def wait_prior(PDL: tl.constexpr):
    """PDL: wait until the kernel before this one has finished and its writes are visible."""
    if PDL > 0:
        tl.extra.cuda.gdc_wait()


@triton.jit
def release_next(PDL: tl.constexpr):
    """PDL mode 2, at a kernel's start: let the next kernel start (it waits in `wait_prior`)."""
    if PDL == 2:
        tl.extra.cuda.gdc_launch_dependents()


@triton.jit
def release_late(PDL: tl.constexpr):
    """PDL mode 1, when a kernel's main work is done (before its stores): let the next start."""
    if PDL == 1:
        tl.extra.cuda.gdc_launch_dependents()


@triton.jit
def grouped_tile(M, N, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, GROUP_M: tl.constexpr):
    """(pid_m, pid_n, grid_m, grid_n) of a tiled matmul's program_id(0): GROUP_M row tiles at a
    time walk the column tiles, so their W tiles are reused from L2."""
    pid = tl.program_id(0)
    grid_m = tl.cdiv(M, BLOCK_M)
    grid_n = tl.cdiv(N, BLOCK_N)
    per_group = GROUP_M * grid_n
    first_m = (pid // per_group) * GROUP_M
    group_size = tl.minimum(grid_m - first_m, GROUP_M)
    return first_m + (pid % per_group) % group_size, (pid % per_group) // group_size, grid_m, grid_n


@triton.jit
def f32_to_bf16_rne(x):
    """f32 -> bf16 rounding to nearest even, in integer ops; NaN becomes the quiet NaN 0x7FC0."""
    bits = x.to(tl.uint32, bitcast=True)
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
    out = tl.where(x != x, 0x7FC0, rounded)
    return out.to(tl.uint16).to(tl.bfloat16, bitcast=True)


@triton.jit
def cast_for(x, ptr):
    """f32 values `x` converted to the element type of `ptr`, rounding to nearest even.

    The GPU's f32 -> bf16 cast rounds to nearest even (one cvt per two elements), but the
    Triton interpreter's truncates; under the interpreter the integer form stands in, so
    interpreter tests check exactly what the GPU computes.
    """
    if ptr.dtype.element_ty == tl.bfloat16:
        if INTERPRETING:
            return f32_to_bf16_rne(x)
        else:
            return x.to(tl.bfloat16)
    else:
        return x.to(ptr.dtype.element_ty)


@triton.jit
def tanh(t):
    """tanh(t) as 2 sigmoid(2t) - 1: absolute error ~1e-7 (exp only, so the interpreter runs it)."""
    return 2.0 * tl.sigmoid(2.0 * t) - 1.0


@triton.jit
def gelu_tanh(x):
    """x/2 (1 + tanh(u)), u = sqrt(2/pi) (x + 0.044715 x^3), as x sigmoid(2u) (the same function)."""
    return x * tl.sigmoid(1.5957691216057308 * (x + 0.044715 * x * x * x))


@triton.jit
def swiglu_oai_f32(g, u, alpha, limit):
    """gpt-oss's clamped SwiGLU in f32: g' sigmoid(alpha g') (clamp(u, -limit, limit) + 1), g' =
    min(g, limit) (ggml's swiglu_oai): one function for the elementwise kernel and the fused
    epilogues, so their bits agree."""
    gc = tl.minimum(g, limit)
    return gc * tl.sigmoid(alpha * gc) * (tl.minimum(tl.maximum(u, -limit), limit) + 1.0)


@triton.jit
def e8m0_half(e):
    """2^(e - 128) as f32 for E8M0 exponents e (int32 0..255): ggml_e8m0_to_fp32_half, e < 2 the
    subnormals 2^-128, 2^-127 (MXFP4's scale). Two selects summed (one is 0): the nested select left
    ptxas a stack frame in the MMQ's 16x64 tile (sm_90)."""
    normal = tl.where(e >= 2, ((e - 1) << 23).to(tl.float32, bitcast=True), 0.0)
    return normal + tl.where(e < 2, (0x00200000 << e).to(tl.float32, bitcast=True), 0.0)
