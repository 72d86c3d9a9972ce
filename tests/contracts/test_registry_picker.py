"""The registry binds every contract of the package; the picker chooses through the contracts
(GEMV for one token, the tiled matmul for many, cost ranking with judge measurements) and says
why nothing fits when nothing does."""

from __future__ import annotations

import json

import pytest
import torch

from minfer.contracts.parser import parse_file
from minfer.contracts.picker import candidates, layout_of, pick
from minfer.contracts.registry import KERNELS_DIR, contract_files, load_registry
from minfer.errors import NoKernelError
from minfer.kernels import sample
from minfer.kernels.cpu import matmul as cpu_matmul
from minfer.kernels.cpu import vnni as cpu_vnni
from minfer.kernels.triton import (
    attention,
    dequant,
    elementwise,
    embed,
    gemv_f32,
    gemv_fused,
    int4,
    lut4,
    mmq,
    moe,
    norm,
    planes,
    q4_0,
    quantize,
    rope,
    torch_ops,
)
from minfer.kernels.wgsl import (
    attention as vk_attention,
)
from minfer.kernels.wgsl import (
    dequant as vk_dequant,
)
from minfer.kernels.wgsl import (
    elementwise as vk_elementwise,
)
from minfer.kernels.wgsl import (
    matmul as vk_matmul,
)
from minfer.kernels.wgsl import (
    moe as vk_moe,
)
from minfer.kernels.wgsl import (
    norm as vk_norm,
)
from minfer.kernels.wgsl import (
    quantize as vk_quantize,
)
from minfer.kernels.wgsl import (
    select as vk_select,
)

LAUNCHERS = {
    "dequant": dequant.dequant,
    "add_f32": elementwise.add_f32,
    "add_bias_f32": elementwise.add_bias_f32,
    "mul_f32": elementwise.mul_f32,
    "silu_f32": elementwise.silu_f32,
    "swiglu": elementwise.swiglu,
    "convert_f32_f16": elementwise.convert_f32_f16,
    "convert_f32_bf16": elementwise.convert_f32_bf16,
    "embed_rows": embed.embed_rows,
    "quantize_q8_0": quantize.quantize_q8_0,
    "q4_0_gemv": q4_0.q4_0_gemv,
    "q4_0_matmul": q4_0.q4_0_matmul,
    "mmq_q4_0": mmq.mmq_q4_0,
    "mmq_int4": mmq.mmq_int4,
    "mmq_q8_0": mmq.mmq_q8_0,
    "mmq_q6_k": mmq.mmq_q6_k,
    "mmq_planes": mmq.mmq_planes,
    "mmq_lut4": mmq.mmq_lut4,
    "int4_gemv": int4.int4_gemv,
    "lut4_gemv": lut4.lut4_gemv,
    "q8_0_gemv": planes.q8_0_gemv,
    "q6_k_gemv": planes.q6_k_gemv,
    "q5_gemv": planes.q5_gemv,
    "q3_k_gemv": planes.q3_k_gemv,
    "q2_k_gemv": planes.q2_k_gemv,
    "gemv_swiglu": gemv_fused.gemv_swiglu,
    "gemv_geglu": gemv_fused.gemv_geglu,
    "gemv_rope": gemv_fused.gemv_rope,
    **{f"{group}_gemv_add_norm": gemv_fused.gemv_add_norm for group in ("q4_0", "int4", "planes", "lut4")},
    "swiglu_rows": elementwise.swiglu_rows,
    "geglu_rows": elementwise.geglu_rows,
    "swiglu_oai": elementwise.swiglu_oai,
    "scale_f32": elementwise.scale_f32,
    "softcap_f32": elementwise.softcap_f32,
    "rms_norm": norm.rms_norm,
    "add_rms_norm": norm.add_rms_norm,
    "norm_add_rms_norm": norm.norm_add_rms_norm,
    "rope": rope.rope,
    "norm_rope": rope.norm_rope,
    "attention_rows": attention.attention_rows,
    "attention_rows_q8": attention.attention_rows_q8,
    "attention_prefill": attention.attention_prefill,
    "attention_prefill_q8": attention.attention_prefill_q8,
    "attention_sdpa": torch_ops.attention_sdpa,
    "attention_sdpa_q8": torch_ops.attention_sdpa_q8,
    "linear_f16": torch_ops.linear_f16,
    "linear_f32": torch_ops.linear_f32,
    "gemv_f32": gemv_f32.gemv_f32,
    "row_select": torch_ops.row_select,
    "argmax_rows": torch_ops.argmax_rows,
    "moe_route_rows": moe.moe_route_rows,
    "moe_gemv": moe.moe_gemv,
    "moe_mmq": moe.moe_mmq,
    "moe_mm16": moe.moe_mm16,
    "moe_gemv_glu": moe.moe_gemv_glu,
    "moe_mm16_glu": moe.moe_mm16_glu,
    "moe_matmul_f16": moe.moe_matmul_f16,
    "moe_sum_rows": moe.moe_sum_rows,
    "sample_rows": sample.sample_rows,
    # the WGSL kernels (backend Vulkan; one launcher serves the seed's per-type contracts)
    "vk_get_rows": vk_dequant.get_rows,
    "vk_dequant_q4_0": vk_dequant.dequant,
    "vk_dequant_q8_0": vk_dequant.dequant,
    "vk_dequant_q4_k": vk_dequant.dequant,
    "vk_qmatvec_q4_0": vk_matmul.qmatvec,
    "vk_matmul_q4_0_tiled": vk_matmul.qmatmul_tiled,
    "vk_qmatvec": vk_matmul.qmatvec,
    "vk_matmul_tiled": vk_matmul.qmatmul_tiled,
    "vk_rms_norm": vk_norm.rms_norm,
    "vk_add_rms_norm": vk_norm.add_rms_norm,
    "vk_add": vk_elementwise.add,
    "vk_add_bias": vk_elementwise.add_bias,
    "vk_swiglu": vk_elementwise.swiglu,
    "vk_geglu": vk_elementwise.geglu,
    "vk_swiglu_oai": vk_elementwise.swiglu_oai,
    "vk_scale": vk_elementwise.scale,
    "vk_softcap": vk_elementwise.softcap,
    "vk_rope": vk_elementwise.rope,
    "vk_attention": vk_attention.attention,
    "vk_row_select": vk_select.row_select,
    "vk_argmax": vk_select.argmax,
    "vk_quantize_q8_0": vk_quantize.quantize_q8_0,
    "vk_moe_route": vk_moe.moe_route,
    "vk_moe_qmatmul": vk_moe.moe_qmatmul,
    "vk_moe_sum": vk_moe.moe_sum,
    "cpu_int4pack_mm": cpu_matmul.int4pack_mm,
    "cpu_int4pack_mm_pair32": cpu_matmul.int4pack_mm,
    "cpu_int4pack_mm_pair16": cpu_matmul.int4pack_mm,
    "cpu_linear_f32": cpu_matmul.linear,
    "cpu_linear_bf16": cpu_matmul.linear,
    "cpu_q4_vnni": cpu_vnni.q4_vnni_mm,
    "cpu_q4_vnni2": cpu_vnni.q4_vnni2_mm,
    "cpu_q8_vnni": cpu_vnni.q4_vnni_mm,
    "cpu_q8_vnni2": cpu_vnni.q4_vnni2_mm,
    "cpu_q5_vnni2": cpu_vnni.q4_vnni2_mm,
    "cpu_q6k_vnni2": cpu_vnni.q4_vnni2_mm,
    "cpu_iq4_vnni2": cpu_vnni.q4_vnni2_mm,
    "cpu_mxfp4_vnni2": cpu_vnni.q4_vnni2_mm,
    "cpu_vnni2_moe": cpu_vnni.vnni2_experts_mm,
    "cpu_swiglu": cpu_vnni.swiglu,
    "cpu_geglu": cpu_vnni.geglu,
    "cpu_argmax_rows": cpu_vnni.argmax_rows,
    "cpu_embed_rows": cpu_vnni.embed_rows,
    "cpu_attention": cpu_vnni.attention,
    "cpu_rms_norm": cpu_vnni.rms_norm,
    "cpu_rope": cpu_vnni.rope_at,
}


def _qmatmul_call(m: int, k: int = 576, n: int = 1536, qtype: str = "Q4_0"):
    return {"x": "F32", "w": qtype}, {"x": (m, k), "w": (n, k // 32 * 18)}, {"n": n, "k": k, "qtype": qtype}


def test_registry_binds_every_launcher(registry):
    assert all(not errs for errs in registry.errors.values()), registry.errors
    assert {name: k.launcher for name, k in registry.kernels.items()} == LAUNCHERS
    sections = [s.kernel for f in contract_files() for s in parse_file(f).sections]
    assert sorted(sections) == sorted(LAUNCHERS)  # one registrable section per launcher, all bound
    gemv = registry.kernels["q4_0_gemv"]
    assert gemv.load_layouts == {"w": q4_0.repack_q4_0} and gemv.takes_out
    assert not registry.kernels["add_bias_f32"].takes_out  # in place
    assert len(gemv.revision) == 16
    assert gemv.revision == registry.kernels["q4_0_matmul"].revision  # one module, one revision


@pytest.mark.parametrize("m, n, k, expected", [
    (1, 1536, 576, "q4_0_gemv"), (2, 1536, 576, "linear_f16"), (512, 1536, 576, "linear_f16"),
    (2, 37888, 3584, "q4_0_gemv"), (4, 37888, 3584, "q4_0_gemv"), (8, 37888, 3584, "linear_f16"),  # 7B gate+up
    (2, 4608, 3584, "linear_f16"), (4, 3584, 18944, "q4_0_gemv"), (4, 6144, 4096, "linear_f16")])
def test_qmatmul_routing(registry, m, n, k, expected):
    """One token: the GEMV (fast path). A small batch: the GEMV where the H200 measured it ahead of
    cuBLAS on the f16 copy (its rows side by side, the weight read from L2: 2 rows of a weight past
    2^24 values, 4 past 5e7; bench/gemv_rows.py), else cuBLAS (fast path m > 1), whose tensor-core
    rate (cost.flop_rate) outweighs its 2-byte weight even where the quantized tiled matmul's own
    fast path (m >= 64) applies."""
    call = {"x": "F32", "w": "Q4_0"}, {"x": (m, k), "w": (n, k // 32 * 18)}, {"n": n, "k": k, "qtype": "Q4_0"}
    assert pick("QMatMul", *call, registry=registry).name == expected


def test_gemv_wins_m1_by_fast_path_though_others_are_admissible(registry):
    ok, rejected = candidates("QMatMul", *_qmatmul_call(1), registry=registry)
    gemv_when = "m == 1 || (m <= 2 && n * k > 16777216) || (m <= 4 && n * k >= 50000000)"
    assert [(c.kernel.name, c.fast_path) for c in ok] == [("q4_0_gemv", gemv_when), ("q4_0_matmul", None),
                                                          ("mmq_q4_0", None), ("linear_f16", None)]
    assert sorted(k.name for k, _ in rejected if k.contract.backend == "CUDA") == sorted([  # the other types'
        "mmq_int4", "mmq_q8_0", "mmq_q6_k", "mmq_planes", "int4_gemv", "q8_0_gemv", "q6_k_gemv", "q5_gemv",
        "q3_k_gemv", "q2_k_gemv", "lut4_gemv", "mmq_lut4", "linear_f32", "gemv_f32"])
    ok, rejected = candidates("QMatMul", *_qmatmul_call(16), registry=registry)
    # only linear_f16 has a fast path at 16; the quantized ones (MINFER_MMQ=1's) ranked by cost
    assert [c.kernel.name for c in ok] == ["linear_f16", "q4_0_matmul", "mmq_q4_0"]
    why = ["shape_constraint 'm <= 8' is false (m=16)"]
    assert ("q4_0_gemv", why) in [(k.name, reasons) for k, reasons in rejected]


@pytest.mark.parametrize("m, kernel", [(1, "gemv_f32"), (2, "gemv_f32"), (32, "gemv_f32"), (33, "linear_f32"),
                                       (512, "linear_f32")])
def test_f32_weights_multiply_in_f32(registry, m, kernel):
    """An F32 weight (a mixture of experts' router) is multiplied in f32 at every row count, as
    llama.cpp does: f16 operands would flip the router's choice of experts at near-ties. Up to 32
    rows by gemv_f32 (one launch, rows independent of each other), past that by cuBLAS; F16
    weights keep cuBLAS on f16."""
    f32 = ({"x": "F32", "w": "F32"}, {"x": (m, 256), "w": (32, 256 * 4)}, {"n": 32, "k": 256, "qtype": "F32"})
    assert pick("QMatMul", *f32, registry=registry).name == kernel
    f16 = ({"x": "F32", "w": "F16"}, {"x": (m, 256), "w": (32, 256 * 2)}, {"n": 32, "k": 256, "qtype": "F16"})
    assert pick("QMatMul", *f16, registry=registry).name == "linear_f16"


@pytest.mark.parametrize("qtype, kernel", [("Q4_0", "q4_0_matmul"), ("Q4K", "mmq_int4"), ("Q4_1", "mmq_int4"),
                                           ("Q8_0", "mmq_q8_0"), ("Q6K", "mmq_q6_k"), ("Q5K", "mmq_planes"),
                                           ("Q2K", "mmq_planes"), ("IQ4_XS", "mmq_lut4"), ("MXFP4", "mmq_lut4")])
def test_quantized_many_row_matmuls_rank_mmq_first(registry, qtype, kernel):
    """Among the kernels that read the quantized weight (what MINFER_MMQ=1 keeps), the int8 MMQ
    ranks first for decode batches past 8 rows and prompt chunks of every type but Q4_0 (the tiled
    q4_0_matmul: the measured rates); cuBLAS stays ahead of both."""
    for m in (9, 16, 64, 512):
        ok, _ = candidates("QMatMul", *_qmatmul_call(m, k=1024, qtype=qtype), registry=registry)
        names = [c.kernel.name for c in ok]
        assert names[0] == "linear_f16" and names[1] == kernel


def test_k_quants_route_to_their_gemv_then_the_f16_copy(registry):
    assert pick("QMatMul", *_qmatmul_call(1, k=1024, qtype="Q4K"), registry=registry).name == "int4_gemv"
    assert pick("QMatMul", *_qmatmul_call(2, k=1024, qtype="Q4K"), registry=registry).name == "linear_f16"
    big = {"x": "F32", "w": "Q4K"}, {"x": (2, 4096), "w": (28672, 4096 // 256 * 144)}, {"n": 28672, "k": 4096,
                                                                                          "qtype": "Q4K"}
    assert pick("QMatMul", *big, registry=registry).name == "int4_gemv"  # 2 rows of the 8B's gate+up
    gemvs = {"Q8_0": "q8_0_gemv", "Q6K": "q6_k_gemv", "Q5_0": "q5_gemv", "Q5_1": "q5_gemv", "Q5K": "q5_gemv",
             "Q3K": "q3_k_gemv", "Q2K": "q2_k_gemv", "IQ4_NL": "lut4_gemv", "IQ4_XS": "lut4_gemv", "MXFP4": "lut4_gemv"}
    for qtype, gemv in gemvs.items():  # every type has a decode GEMV; batches of small weights take the f16 copy
        assert pick("QMatMul", *_qmatmul_call(1, k=1024, qtype=qtype), registry=registry).name == gemv
        assert pick("QMatMul", *_qmatmul_call(2, k=1024, qtype=qtype), registry=registry).name == "linear_f16"
    assert pick("QMatMul", *_qmatmul_call(1, k=1024, qtype="F16"), registry=registry).name == "linear_f16"


def test_positional_dtypes_and_rank_1_activation(registry):
    k = pick("QMatMul", ["F32", "Q4_0"], [(576,), (1536, 324)], {"n": 1536, "k": 576, "qtype": "Q4_0"},
             registry=registry)
    assert k.name == "q4_0_gemv"


def test_no_kernel_names_op_dtypes_shapes_and_nearest(registry):
    with pytest.raises(NoKernelError) as e:
        pick("QMatMul", {"x": "F16", "w": "Q4K"}, {"x": (8, 576), "w": (1536, 324)},
             {"n": 1536, "k": 576, "qtype": "Q4K"}, registry=registry)
    msg = str(e.value)
    assert "QMatMul" in msg and "'w': 'Q4K'" in msg and "(8, 576)" in msg
    assert "linear_f16: x: dtype F16 not in ['F32']" in msg
    assert "mmq_int4: x: dtype F16 not in ['F32']" in msg  # the nearest: only x's dtype is wrong
    with pytest.raises(NoKernelError, match=r"divisible\(k, 32\)' is false \(k=100\)"):
        pick("QMatMul", *_qmatmul_call(4, k=100), registry=registry)
    with pytest.raises(NoKernelError, match="backend CUDA, not CPU"):  # no cpu contract for AddRMSNorm
        pick("AddRMSNorm", ["F32", "F32", "F32"], [(4, 576), (4, 576), (576,)], {"eps": 1e-5}, backend="CPU",
             registry=registry)
    assert pick("RMSNorm", ["F32", "F32"], [(4, 576), (576,)], {"eps": 1e-5}, backend="CPU",
                registry=registry).name == "cpu_rms_norm"
    # the contracts rank the VNNI kernel first (the cpu backend drops it where it cannot run)
    assert pick("QMatMul", *_qmatmul_call(4), backend="CPU", registry=registry).name == "cpu_q4_vnni"
    ok, _ = candidates("QMatMul", *_qmatmul_call(4), backend="CPU", registry=registry)
    assert [c.kernel.name for c in ok] == ["cpu_q4_vnni", "cpu_q4_vnni2", "cpu_int4pack_mm"]
    with pytest.raises(NoKernelError, match="unknown op 'Conv2d'"):
        pick("Conv2d", {}, {}, registry=registry)


def test_output_dtype_and_tied_input_dtypes(registry):
    k = pick("Convert", ["F32"], [(7,)], out_dtype=torch.bfloat16, registry=registry)
    assert k.name == "convert_f32_bf16"
    assert pick("Convert", ["F32"], [(7,)], out_dtype="F16", registry=registry).name == "convert_f32_f16"
    with pytest.raises(NoKernelError, match="output dtype"):
        pick("Convert", ["F32"], [(7,)], out_dtype="F64", registry=registry)
    assert pick("SwiGLU", ["BF16", "BF16"], [(2, 8), (2, 8)], registry=registry).name == "swiglu"
    with pytest.raises(NoKernelError, match="up: dtype F32 not in"):
        pick("SwiGLU", ["BF16", "F32"], [(2, 8), (2, 8)], registry=registry)  # up must have gate's dtype
    params = {"qtype": 12, "rows": 3, "cols": 256, "out_dtype": torch.bfloat16}
    k = pick("Dequantize", ["Q4K"], [(3, 144)], params, out_dtype="BF16", registry=registry)
    assert k.name == "dequant"


def test_layout_rejection(registry):
    x = torch.zeros(4, 6)[:, ::2]  # strided view
    lay = {"x": layout_of(x), "y": layout_of(torch.zeros(4, 3))}
    assert lay["x"]["strided"] and not lay["x"]["contiguous"]
    with pytest.raises(NoKernelError, match="x: not contiguous"):
        pick("Add", ["F32", "F32"], [(4, 3), (4, 3)], layouts=lay, registry=registry)
    offset = torch.zeros(10)[2:]  # contiguous view with a storage offset: accepted
    assert layout_of(offset)["start_offset"] and layout_of(offset)["contiguous"]
    lay = {"x": layout_of(offset), "y": layout_of(offset)}
    assert pick("Add", ["F32", "F32"], [(8,), (8,)], layouts=lay, registry=registry).name == "add_f32"


def _two_adds(tmp_path):
    """A contract file with two interchangeable Add kernels (same launcher, different names)."""
    text = (KERNELS_DIR / "triton" / "elementwise.fkc.md").read_text()
    head, rest = text.split("## add_f32", 1)
    first = "## add_f32" + rest.split("## mul_f32", 1)[0]
    second = first.replace("kernel: add_f32", "kernel: add_f32_b")
    path = tmp_path / "adds.fkc.md"
    path.write_text(head + first + second)
    return path


def test_cost_ranking_reads_judge_measurements(tmp_path):
    path = _two_adds(tmp_path)
    reg = load_registry([path])
    assert set(reg.kernels) == {"add_f32", "add_f32_b"}
    call = (["F32", "F32"], [(1, 576), (1, 576)])
    assert pick("Add", *call, registry=reg).name == "add_f32"  # equal costs: file order
    rev = reg.kernels["add_f32"].revision
    report = {
        "minfer_judge": 1, "backend": "CUDA", "device": "test GPU", "copy_bandwidth_gbs": 4000.0,
        "kernels": {
            "add_f32": {"revision": rev, "overhead_ns": 9000.0, "results": []},
            "add_f32_b": {"revision": rev, "overhead_ns": 2500.0, "results": []},
        },
    }
    judge = tmp_path / "judge.json"
    judge.write_text(json.dumps(report))
    reg = load_registry([path], judge_report=judge)
    ok, _ = candidates("Add", *call, registry=reg)
    assert [c.kernel.name for c in ok] == ["add_f32_b", "add_f32"]
    n = 576  # cost = measured overhead + bytes / measured copy bandwidth + flops / rate
    assert ok[0].cost_ns == pytest.approx(2500.0 + 12 * n / 4000e9 * 1e9 + n / 60e12 * 1e9)
    # a measurement of another revision of the kernel is ignored
    report["kernels"]["add_f32"]["revision"] = "0" * 16
    report["kernels"]["add_f32_b"]["revision"] = "0" * 16
    judge.write_text(json.dumps(report))
    reg = load_registry([path], judge_report=judge)
    assert reg.measured_overhead_ns(reg.kernels["add_f32_b"]) is None
    assert pick("Add", *call, registry=reg).name == "add_f32"


def test_malformed_judge_report_is_a_typed_error(tmp_path):
    from minfer.errors import MinferError

    bad = tmp_path / "judge.json"
    bad.write_text('{"kernels": 3}')
    with pytest.raises(MinferError, match="judge report"):
        load_registry([_two_adds(tmp_path)], judge_report=bad)


def test_invalid_section_is_listed_not_bound(tmp_path):
    path = _two_adds(tmp_path)
    path.write_text(path.read_text().replace("kernel: add_f32_b", "kernel: add_f32_b\ncolour: red"))
    reg = load_registry([path])
    assert "add_f32_b" not in reg.kernels and "add_f32" in reg.kernels
    assert [e.rule for e in reg.errors["add_f32_b"]] == ["UnknownField"]
    with pytest.raises(Exception, match="UnknownField"):
        reg.check()
