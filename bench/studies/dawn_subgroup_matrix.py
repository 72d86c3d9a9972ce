"""Can the vulkan backend reach tensor cores through Dawn? (issue 27 item 3: Vulkan prefill on tensor cores.)

wgpu-py's wgpu-native offers `cooperative-matrix` on the H200 (stop 37) but its WGSL gets 8x8 f32 matrices only.
`wgpudawn` (PyPI: wgpu-py's API on Google's Dawn, the WebGPU of Chrome) offers Dawn's experimental
`chromium-experimental-subgroup-matrix`: WGSL `subgroup_matrix_left/right/result` types of the configurations the
Vulkan driver lists (VK_KHR_cooperative_matrix: f16 and i8 at 16x16-class shapes on NVIDIA; Dawn's
`vulkan_enable_f16_on_nvidia` toggle for f16). This probe answers, on the GPU machine, before any kernel of the
backend is written on it:

1. which configurations the adapter lists (M, N, K, component and result types, subgroup sizes);
2. for each f16 -> f32 and i8 -> i32 configuration: a plain tiled product C[m, n] = A[m, k] . B[n, k]^T (the
   prefill's x . W^T, B loaded column-major), checked against numpy on a small case, then timed at 2048^3 (--size)
   in two forms: each subgroup loading its tiles straight from the storage buffers ("global"), and a workgroup staging
   its A and B panels in workgroup memory first ("shared"). TFLOP/s (TOP/s for i8) by wall clock over
   `--reps` dispatches in one submission.

For scale: the vulkan backend's tiled prefill runs ~19 TFLOP/s-equivalent on the 7B (pp512 1,278 tok/s) and
llama.cpp's Vulkan build with NV_coopmat2 ~170 (11,111 tok/s); the H200's dense f16 tensor-core peak is ~990.

Run on the GPU machine (no network, no Vulkan loader): carry ".gl" (the loader's .deb, bench/vulkan_h200.sh's header)
and ".whl" (here: `pip download --no-deps -d .whl wgpudawn==0.32.0.4 cffi pycparser` for Python 3.12), then
    . bench/vulkan_env.sh; timeout 200 python3 bench/studies/dawn_subgroup_matrix.py [--size 2048] [--reps 5]
(vulkan_env.sh unpacks the loader, points it at NVIDIA's ICD and unzips the wheels into /tmp/pylib.)
`--null`: Dawn's Null backend (no GPU: the shaders are parsed and validated only, nothing runs; this machine's
check that the WGSL below is well formed).
"""

from __future__ import annotations

import argparse
import json
import os
import time

import numpy as np

TOGGLES = ["allow_unsafe_apis", "vulkan_enable_f16_on_nvidia"]
FEATURES = ["subgroups", "shader-f16", "chromium-experimental-subgroup-matrix"]
TYPES = {  # component -> (WGSL element type of the storage arrays, result WGSL type, numpy type, bytes per element)
    "f16": ("f16", "f32", np.float16, 2),
    "i8": ("i32", "i32", np.int8, 1),
}
VARIANTS = ("global", "shared")
TM, TN = 2, 2  # result tiles per subgroup (rows x columns of configurations)
SGM, SGN = 2, 2  # subgroups per workgroup (rows x columns)


def shader(cfg: dict, variant: str, sg_size: int) -> str:
    """WGSL of C = A . B^T for one configuration: A [m, k] row-major, B [n, k] row-major (each of its row a column
    of the right matrix: loaded column-major with stride k), C [m, n] row-major. A workgroup of SGM x SGN
    subgroups computes (SGM TM M) x (SGN TN N) of C; `shared` first copies the workgroup's A and B panels of one
    K step into workgroup memory (every invocation a share of the elements), then loads the matrices from there."""
    comp, res = cfg["component_type"], cfg["result_component_type"]
    elem, rtype = TYPES[comp][0], TYPES[comp][1]
    m, n, k = cfg["m"], cfg["n"], cfg["k"]
    left, right, result = (f"subgroup_matrix_left<{comp}, {k}, {m}>", f"subgroup_matrix_right<{comp}, {n}, {k}>",
                           f"subgroup_matrix_result<{res}, {n}, {m}>")
    wg = SGM * SGN * sg_size
    rows, cols = SGM * TM * m, SGN * TN * n  # the workgroup's block of C
    head = f"""enable f16;
enable subgroups;
enable chromium_experimental_subgroup_matrix;
diagnostic(off, chromium_experimental.subgroup_matrix_uniformity);

struct Dims {{ m: u32, n: u32, k: u32, pad: u32 }}
@group(0) @binding(0) var<storage, read> A: array<{elem}>;
@group(0) @binding(1) var<storage, read> B: array<{elem}>;
@group(0) @binding(2) var<storage, read_write> C: array<{rtype}>;
@group(0) @binding(3) var<uniform> dims: Dims;
"""
    if comp == "i8":  # (i8 components live in i32 words: the panels are copied as words, 4 components each)
        per, words = 4, "u32"
    else:
        per, words = 1, elem
    if variant == "shared":
        head += f"""var<workgroup> As: array<{elem}, {rows * k // per}>;
var<workgroup> Bs: array<{elem}, {cols * k // per}>;
"""
    body = f"""
@compute @workgroup_size({wg})
fn main(@builtin(workgroup_id) wid: vec3u, @builtin(subgroup_id) sg: u32,
        @builtin(local_invocation_index) li: u32) {{
    let row0 = wid.y * {rows}u;
    let col0 = wid.x * {cols}u;
    let sr = (sg / {SGN}u) * {TM * m}u;  // this subgroup's tiles within the workgroup's block
    let sc = (sg % {SGN}u) * {TN * n}u;
    var acc: array<{result}, {TM * TN}>;
    for (var kk = 0u; kk < dims.k; kk += {k}u) {{
"""
    if variant == "shared":
        body += f"""        for (var e = li; e < {rows * k // per}u; e += {wg}u) {{
            let r = e / {k // per}u;
            let c = e % {k // per}u;
            As[e] = A[((row0 + r) * dims.k + kk) / {per}u + c];
        }}
        for (var e = li; e < {cols * k // per}u; e += {wg}u) {{
            let r = e / {k // per}u;
            let c = e % {k // per}u;
            Bs[e] = B[((col0 + r) * dims.k + kk) / {per}u + c];
        }}
        workgroupBarrier();
        var a: array<{left}, {TM}>;
        for (var i = 0u; i < {TM}u; i++) {{
            a[i] = subgroupMatrixLoad<{left}>(&As, (sr + i * {m}u) * {k}u, false, {k}u);
        }}
        for (var j = 0u; j < {TN}u; j++) {{
            let b = subgroupMatrixLoad<{right}>(&Bs, (sc + j * {n}u) * {k}u, true, {k}u);
            for (var i = 0u; i < {TM}u; i++) {{
                acc[i * {TN}u + j] = subgroupMatrixMultiplyAccumulate(a[i], b, acc[i * {TN}u + j]);
            }}
        }}
        workgroupBarrier();
    }}
"""
    else:
        body += f"""        var a: array<{left}, {TM}>;
        for (var i = 0u; i < {TM}u; i++) {{
            a[i] = subgroupMatrixLoad<{left}>(&A, (row0 + sr + i * {m}u) * dims.k + kk, false, dims.k);
        }}
        for (var j = 0u; j < {TN}u; j++) {{
            let b = subgroupMatrixLoad<{right}>(&B, (col0 + sc + j * {n}u) * dims.k + kk, true, dims.k);
            for (var i = 0u; i < {TM}u; i++) {{
                acc[i * {TN}u + j] = subgroupMatrixMultiplyAccumulate(a[i], b, acc[i * {TN}u + j]);
            }}
        }}
    }}
"""
    body += f"""    for (var i = 0u; i < {TM}u; i++) {{
        for (var j = 0u; j < {TN}u; j++) {{
            subgroupMatrixStore(&C, (row0 + sr + i * {m}u) * dims.n + col0 + sc + j * {n}u, acc[i * {TN}u + j],
                                false, dims.n);
        }}
    }}
}}
"""
    del words
    return head + body


def block(cfg: dict) -> tuple[int, int]:
    return SGM * TM * cfg["m"], SGN * TN * cfg["n"]


def run_case(wgpu, device, cfg: dict, variant: str, sg_size: int, size: tuple[int, int, int], reps: int,
             check: bool, null: bool) -> dict:
    comp = cfg["component_type"]
    _, _, npt, nbytes = TYPES[comp]
    m, n, k = size
    module = device.create_shader_module(code=shader(cfg, variant, sg_size))
    pipe = device.create_compute_pipeline(layout="auto", compute={"module": module, "entry_point": "main"})
    if null:
        return {"compiled": True}
    rng = np.random.default_rng(0)
    if comp == "f16":
        a, b = (rng.standard_normal(s).astype(np.float16) for s in ((m, k), (n, k)))
        want = a.astype(np.float32) @ b.astype(np.float32).T
    else:
        a, b = (rng.integers(-128, 128, s, dtype=np.int8) for s in ((m, k), (n, k)))
        want = a.astype(np.int64) @ b.astype(np.int64).T
    usage = wgpu.BufferUsage
    ba = device.create_buffer_with_data(data=a.tobytes(), usage=usage.STORAGE)
    bb = device.create_buffer_with_data(data=b.tobytes(), usage=usage.STORAGE)
    bc = device.create_buffer(size=m * n * 4, usage=usage.STORAGE | usage.COPY_SRC)
    bd = device.create_buffer_with_data(data=np.array([m, n, k, 0], np.uint32).tobytes(),
                                     usage=usage.UNIFORM | usage.COPY_SRC)  # (read back: the wait below)
    group = device.create_bind_group(layout=pipe.get_bind_group_layout(0), entries=[
        {"binding": i, "resource": {"buffer": buf, "offset": 0, "size": buf.size}}
        for i, buf in enumerate((ba, bb, bc, bd))])
    rows, cols = block(cfg)
    grid = (n // cols, m // rows, 1)

    def submit(times: int) -> None:
        enc = device.create_command_encoder()
        cp = enc.begin_compute_pass()
        cp.set_pipeline(pipe)
        cp.set_bind_group(0, group)
        for _ in range(times):
            cp.dispatch_workgroups(*grid)
        cp.end()
        device.queue.submit([enc.finish()])

    submit(1)
    got = np.frombuffer(device.queue.read_buffer(bc), np.float32 if comp == "f16" else np.int32).reshape(m, n)
    out = {"elements_per_byte": 1 / nbytes}
    if check:
        err = np.abs(got.astype(np.float64) - want)
        out.update(max_abs_err=float(err.max()), max_ref=float(np.abs(want).max()))
    t = time.perf_counter()
    submit(reps)
    device.queue.read_buffer(bd)  # (waits for the work before it)
    dt = (time.perf_counter() - t) / reps
    out.update(us=dt * 1e6, tflops=2 * m * n * k / dt / 1e12)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--size", type=int, default=2048, help="m = n = k of the timed product")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--null", action="store_true", help="Dawn's Null backend: compile the shaders only")
    args = ap.parse_args()
    if args.null:
        os.environ["WGPU_BACKEND_TYPE"] = "Null"
    import wgpudawn as wgpu
    from wgpudawn.backends.dawn import extras

    extras.set_instance_extras(enable_toggles=TOGGLES)
    adapter = wgpu.gpu.request_adapter_sync(power_preference="high-performance")
    props = extras.get_adapter_properties(adapter)
    configs = props.get("subgroup_matrix_configs", [])
    info = {k: adapter.info.get(k) for k in ("device", "backend_type")}
    for key in ("subgroup_min_size", "subgroup_max_size"):  # (wgpudawn 0.32.0.4 spells them stackgroup_*)
        info[key] = adapter.info.get(key, adapter.info.get(key.replace("subgroup", "stackgroup")))
    print(json.dumps({"adapter": info, "subgroup_matrix": "chromium-experimental-subgroup-matrix" in adapter.features,
                      "configs": configs}, indent=1))
    feats = [f for f in FEATURES if f in adapter.features]
    device = adapter.request_device_sync(required_features=feats)
    if args.null:  # the Null adapter lists no configurations: the ones NVIDIA's driver is expected to give
        configs = [{"component_type": "f16", "result_component_type": "f32", "m": 16, "n": 16, "k": 16},
                   {"component_type": "i8", "result_component_type": "i32", "m": 16, "n": 16, "k": 32}]
    print("\n| configuration | result |\n|---|---|", flush=True)
    for cfg in configs:
        if cfg["component_type"] not in TYPES or cfg["result_component_type"] != TYPES[cfg["component_type"]][1]:
            continue
        sg_size = int(cfg.get("min_subgroup_size") or 32)  # (the configuration's; NVIDIA's: 32)
        r, c = block(cfg)
        small = (2 * r, 2 * c, 4 * cfg["k"])
        big = tuple(-(-args.size // q) * q for q in (r, c, cfg["k"]))
        for variant in VARIANTS:
            name = f"{cfg['component_type']}->{cfg['result_component_type']} {cfg['m']}x{cfg['n']}x{cfg['k']} {variant}"
            try:
                if args.null:
                    run_case(wgpu, device, cfg, variant, sg_size, small, 1, False, True)
                    res = "WGSL accepted (Null backend: not run)"
                else:  # the check first (printed on its own: a slow or hung timing below still leaves it)
                    ok = run_case(wgpu, device, cfg, variant, sg_size, small, 1, True, False)
                    print(f"| {name} | check max|err| {ok['max_abs_err']:.3g} (max |ref| {ok['max_ref']:.3g}); "
                          f"{small[0]}x{small[1]}x{small[2]}: {ok['us']:.0f} us |", flush=True)
                    perf = run_case(wgpu, device, cfg, variant, sg_size, big, args.reps, False, False)
                    res = f"{big[0]}x{big[1]}x{big[2]}: {perf['us']:.0f} us, {perf['tflops']:.1f} T/s"
            except Exception as e:  # noqa: BLE001 (a probe: every failure is a finding to print)
                res = f"FAILED: {type(e).__name__}: {str(e)[:300]}"
            print(f"| {name} | {res} |", flush=True)


if __name__ == "__main__":
    main()
