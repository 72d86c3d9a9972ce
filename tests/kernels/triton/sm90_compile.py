"""Compile every kernel family for Hopper (sm_90) without a GPU, and report its resources.

The interpreter checks what a kernel computes, not whether the compiler accepts it: a construct
the interpreter runs can still fail to lower, and a config can spill registers. Triton compiles
for any target on a machine without a GPU (its wheel ships ptxas), so this module compiles one
variant per kernel family / type / config and checks the cubin: no local-memory spills.

Run as a script (test_compile_sm90.py does, in a subprocess, because the kernel tests import the
kernels in interpreter mode): prints one line per variant, exits 1 on a compile error or spill.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

TARGET = ("cuda", 90, 32)


def variants():
    """(name, jit function, signature, constexprs, options) for each variant to compile."""

    import torch
    import triton
    import triton.language as tl

    from minfer.kernels.triton import (
        attention,
        dequant,
        elementwise,
        gemv,
        lut4,
        mmq,
        moe,
        norm,
        planes,
        q4_0,
        quantize,
        rope,
    )
    from minfer.quant.types import QUANT_TABLE, GGMLType

    c = "constexpr"
    out = []
    for op, z in [("silu", "*fp32"), ("scale", "*fp32"), ("softcap", "*fp32"), ("copy", "*fp16"), ("copy", "*bf16")]:
        sig = {"x_ptr": "*fp32", "z_ptr": z, "n": "i64", "c": "fp32", "OP": c, "BLOCK": c, "EVEN": c, "PDL": c}
        consts = {"OP": op, "BLOCK": elementwise.BLOCK, "EVEN": op == "copy", "PDL": 2}
        out.append((f"map1[{op}->{z}]", elementwise._map1_kernel, sig, consts, {}))
    for op, t in [("add", "*fp32"), ("mul", "*fp32"), ("swiglu", "*fp32"), ("swiglu", "*bf16"),
                  ("swiglu_oai", "*fp32")]:
        sig = {"x_ptr": t, "y_ptr": t, "z_ptr": t, "n": "i32", "alpha": "fp32", "limit": "fp32", "OP": c, "BLOCK": c,
               "EVEN": c}
        consts = {"OP": op, "BLOCK": elementwise.BLOCK, "EVEN": False}
        out.append((f"map2[{op} {t}]", elementwise._map2_kernel, sig, consts, {}))
    sig = {"y_ptr": "*fp32", "b_ptr": "*fp32", "d": "i32", "BLOCK_D": c, "PDL": c}
    out.append(("add_bias", elementwise._add_bias_kernel, sig, {"BLOCK_D": elementwise.BIAS_BLOCK, "PDL": 2}, {}))

    from minfer.kernels.triton import gemv_f32

    sig = {"x_ptr": "*fp32", "w_ptr": "*fp32", "out_ptr": "*fp32", "N": "i32", "K": "i32", "BLOCK_N": c, "BLOCK_K": c,
           "EVEN_K": c, "PDL": c}
    for n, k in ((128, 2048), (32, 2880)):  # the routers of Qwen3-30B-A3B and gpt-oss-20b
        consts = {"BLOCK_N": gemv_f32.gemv_block_n(n), "BLOCK_K": gemv_f32.BLOCK_K, "EVEN_K": k % gemv_f32.BLOCK_K == 0,
                  "PDL": 2}
        out.append((f"gemv_f32[{n}x{k}]", gemv_f32._gemv_f32_kernel, sig, consts, {"num_warps": 4}))
    storage = {"F32": "*fp32", "F16": "*fp16", "BF16": "*i16"}
    no_fma = {"enable_fp_fusion": False}
    sig_base = {"src_ptr": None, "out_ptr": None, "ids_ptr": "*i32", "n_blocks": "i64",
                "blocks_per_row": "i32", "n_vocab": "i32", "magic": "i32", "QTYPE": c, "BLOCK_BYTES": c,
                "NSUB": c, "SUBLEN": c, "BLOCK": c, "EVEN": c, "GATHER": c}
    for info in QUANT_TABLE.values():
        src = storage.get(info.name, "*u8")
        meta = dict(dequant.tile_meta(info), BLOCK_BYTES=info.block_bytes if src == "*u8" else 1)
        # every type to f16; f32 (the most registers) for the quant types; bf16 once per decoder family
        dsts = ["*fp16"] + ["*fp32"] * (src == "*u8") + ["*bf16"] * (info.name in ("F16", "Q4_0", "Q6_K"))
        for dst in dsts:
            sig = dict(sig_base, src_ptr=src, out_ptr=dst)
            consts = dict(meta, BLOCK=dequant.blocks_per_program(info), EVEN=False, GATHER=False)
            out.append((f"dequant[{info.name}->{dst}]", dequant._dequant_kernel, sig, consts, no_fma))
        if info.name in ("F16", "Q8_0", "Q4_K", "Q6_K"):  # the embedding gather: the same kernel, GATHER on
            sig = dict(sig_base, src_ptr=src, out_ptr="*fp32")
            consts = dict(meta, BLOCK=dequant.blocks_per_program(info), EVEN=False, GATHER=True)
            out.append((f"embed[{info.name}]", dequant._dequant_kernel, sig, consts, no_fma))

    sig = {"x_ptr": "*fp32", "out_ptr": "*u8", "n_blocks": "i64", "BLOCK": c}
    out.append(("quantize_q8_0", quantize._quantize_q8_0_kernel, sig, {"BLOCK": quantize.BLOCK}, no_fma))
    sig = {"x_ptr": "*fp32", "q_ptr": "*i32", "s_ptr": "*fp32", "n_blocks": "i64", "BLOCK": c, "PASSES": c, "PDL": c}
    for passes in (1, 2):
        out.append((f"quantize_act_q8[{passes}]", quantize._quantize_act_kernel, sig,
                    {"BLOCK": quantize.ACT_BLOCK, "PASSES": passes, "PDL": 2}, {"num_warps": 1}))

    sig = {"x_ptr": "*fp32", "qs_ptr": "*i32", "d_ptr": "*fp16", "out_ptr": "*fp32", "part_ptr": "*fp32",
           "cnt_ptr": "*i32", "N": "i32", "NKB": "i32", "KB_SPLIT": "i32", "NSPLIT": "i32", "magic": "i32",
           "half_shift": "i32", "m_ptr": "*fp16", "M_STRIDE": "i32", "h_ptr": "*i32", "hi_shift": "i32", "R": c,
           "LR": c, "LK": c, "WK": c, "SPLIT": c, "EVEN_K": c, "MODE": c, "PREFETCH": c, "PDL": c, "PLANES": c,
           "LB": c, "HB": c, "CENTER": c, "e_ptr": "*fp32", "dst_ptr": "*i32", "fi_ptr": "*i32", "cos_ptr": "*fp32",
           "sin_ptr": "*fp32", "pos_ptr": "*i32", "HALF": "i32", "ck_ptr": "*fp16", "cv_ptr": "*fp16",
           "slot_ptr": "*i32", "KSTART": "i32", "VSTART": "i32", "HD": "i32", "LAYER_OFF": "i64", "S_STRIDE": "i64",
           "H_STRIDE": "i64", "EPI": c, "xs_ptr": "*fp32", "Q8X": c, "t0": "i32", "t1": "i32", "t2": "i32",
           "t3": "i32", "ids_ptr": "*i32", "XDIV": "i32", "XROWS": "i32", "GLU_OFF": "i32", "LUT": c, "MOE": c,
           "MOE_BIAS": c, "ROWS": c, "MOE_GLU": c, "ALPHA": c, "LIMIT": c, "rs_ptr": "*fp32", "RS_N": "i32",
           "RS_K": "i32", "RS_EPS": "fp32", "RSTD": c}
    no_planes = {"PLANES": False, "LB": 4, "HB": 0, "CENTER": 0, "EPI": 0, "LUT": False, "MOE": False,
                 "MOE_BIAS": False, "ROWS": False, "MOE_GLU": False, "ALPHA": 0.0, "LIMIT": 0.0, "RSTD": 0}

    def q8(passes):  # the x operand of a GEMV with int8 activations (passes > 0): code words
        return {"x_ptr": "*i32" if passes else "*fp32"}
    scale_types = {0: ("*fp16", "*fp16"), 1: ("*fp16", "*fp16"), 2: ("*i16", "*i32")}  # Q4_0, Q4_1, Q4_K
    for mode, (d_t, m_t) in scale_types.items():
        for n, k in [(18944, 3584), (3584, 18944)]:  # the configs gemv_config picks: no split, split
            base = gemv._gemv_config(n, k, affine=mode > 0)  # the f32-activation tile
            prefetching = [] if base.prefetch else [
                (gemv.GemvConfig(r=base.r, lr=base.lr, wk=base.wk, split=base.split, prefetch=True,
                                    maxnreg=gemv.PREFETCH_REGS[mode]), False)]
            variants = [(base, e) for e in ((True, False) if mode == 0 else (False,))] + prefetching
            variants += [(gemv.with_act_q8(base, p), False) for p in (1, 2)]  # the int8 activation forms
            variants = [(cfg, even, False) for cfg, even in variants]
            variants += [(cfg, False, True) for cfg in (base, gemv.with_act_q8(base, 2))]  # small batches (ROWS)
            for cfg, even, rows in variants:
                name = (f"gemv[mode {mode} r{cfg.r} lr{cfg.lr} wk{cfg.wk} split={cfg.split} even={even} "
                        f"prefetch={cfg.prefetch} q8={cfg.q8}{' rows' if rows else ''}]")
                consts = dict(R=cfg.r, LR=cfg.lr, LK=32 // cfg.lr, WK=cfg.wk, SPLIT=cfg.split > 1, EVEN_K=even,
                              MODE=mode, PREFETCH=cfg.prefetch, PDL=True, Q8X=cfg.q8, **dict(no_planes, ROWS=rows))
                opts = {"num_warps": cfg.wk, "maxnreg": cfg.maxnreg}
                out.append((name, gemv._q4_0_gemv_kernel, dict(sig, d_ptr=d_t, m_ptr=m_t, **q8(cfg.q8)), consts,
                            opts))
    # the planes types (planes_gemv): each type at the production configs of a wide and a long-K shape
    ptr = {torch.int8: "*i8", torch.int16: "*i16", torch.int32: "*i32", torch.float16: "*fp16"}
    plane_dtypes = {0: (torch.float16, torch.float16), 1: (torch.float16, torch.float16),
                    2: (torch.int16, torch.int32), 3: (torch.int16, torch.float16), 4: (torch.int16, torch.int32)}
    for t, pt in planes.PLANE_TYPES.items():
        d_t, m_t = plane_dtypes[pt.mode]
        for n, k in [(18944, 3584), (3584, 18944)]:
            cfg = planes.planes_config(n, k, t)
            name = f"planes_gemv[{t.name} wk{cfg.wk} split={cfg.split} prefetch={cfg.prefetch} regs={cfg.maxnreg}]"
            consts = dict(R=cfg.r, LR=cfg.lr, LK=32 // cfg.lr, WK=cfg.wk, SPLIT=cfg.split > 1, EVEN_K=False,
                          MODE=pt.mode, PREFETCH=cfg.prefetch, PDL=True, PLANES=True, LB=pt.lb, HB=pt.hb,
                          CENTER=pt.center, EPI=0, Q8X=0, LUT=False, ROWS=False, RSTD=0)
            planes_sig = dict(sig, qs_ptr=ptr[planes._WORD_DTYPES[pt.lb]], d_ptr=ptr[d_t], m_ptr=ptr[m_t],
                          h_ptr=ptr[planes._WORD_DTYPES[pt.hb]] if pt.hb else ptr[planes._WORD_DTYPES[pt.lb]])
            opts = {"num_warps": cfg.wk, "maxnreg": cfg.maxnreg}
            out.append((name, gemv._q4_0_gemv_kernel, planes_sig, consts, opts))
    # the lookup types (lut4_gemv): each at the production configs of a wide and a long-K shape, f32 and int8 x
    lut_scales = {0: ("*fp16", "*fp16"), 5: ("*i8", "*fp16"), 6: ("*u8", "*u8")}
    for t in lut4.LUT4_TYPES:
        d_t, m_t = lut_scales[lut4.LUT4_MODES[t]]
        for n, k in [(18944, 3584), (3584, 18944)]:
            base = gemv._gemv_config(n, k, affine=True)
            for cfg in (base, gemv.with_act_q8(base, 2), gemv.with_act_q8(base, 1)):
                name = f"lut4_gemv[{t.name} wk{cfg.wk} split={cfg.split} prefetch={cfg.prefetch} q8={cfg.q8}]"
                consts = dict(R=cfg.r, LR=cfg.lr, LK=32 // cfg.lr, WK=cfg.wk, SPLIT=cfg.split > 1, EVEN_K=False,
                              MODE=lut4.LUT4_MODES[t], PREFETCH=cfg.prefetch, PDL=True, Q8X=cfg.q8,
                              **dict(no_planes, LUT=True))
                opts = {"num_warps": cfg.wk, "maxnreg": cfg.maxnreg}
                out.append((name, gemv._q4_0_gemv_kernel, dict(sig, d_ptr=d_t, m_ptr=m_t, **q8(cfg.q8)), consts,
                            opts))
    # the expert GEMV (moe.py): Qwen3-30B-A3B's gate / up (Q4_K [768, 2048]) and down (Q6_K [2048, 768]), Q4_0,
    # gpt-oss-20b's MXFP4 [2880, 2880]; moe_gemv_config's one-row tile (8 slots) and batch tile (128 slots)
    from minfer.kernels.triton.moe import moe_gemv_config

    for t, (n, k) in [(GGMLType.Q4_K, (768, 2048)), (GGMLType.Q6_K, (2048, 768)), (GGMLType.Q4_0, (768, 2048)),
                      (GGMLType.MXFP4, (2880, 2880))]:
        for slots in (8, 128):
            cfg = moe_gemv_config(n, k, t, slots)
            pt = planes.PLANE_TYPES.get(t)
            lut = t in lut4.LUT4_TYPES
            mode = pt.mode if pt else lut4.LUT4_MODES[t] if lut else (2 if t == GGMLType.Q4_K else 0)
            consts = dict(R=cfg.r, LR=cfg.lr, LK=32 // cfg.lr, WK=cfg.wk, SPLIT=False, EVEN_K=False, MODE=mode,
                          PREFETCH=cfg.prefetch, PDL=True, Q8X=cfg.q8, **dict(no_planes, MOE=True, LUT=lut))
            d_t, m_t = lut_scales[mode] if lut else scale_types.get(mode, ("*fp16", "*fp16"))
            tsig = dict(sig, d_ptr=d_t, m_ptr=m_t, **q8(cfg.q8))
            if pt:
                d_t, m_t = plane_dtypes[pt.mode]
                consts.update(PLANES=True, LB=pt.lb, HB=pt.hb, CENTER=pt.center)
                tsig = dict(sig, qs_ptr=ptr[planes._WORD_DTYPES[pt.lb]], d_ptr=ptr[d_t], m_ptr=ptr[m_t],
                            h_ptr=ptr[planes._WORD_DTYPES[pt.hb]] if pt.hb else ptr[planes._WORD_DTYPES[pt.lb]])
            out.append((f"moe_gemv[{t.name} {n}x{k} r{cfg.r} lr{cfg.lr} wk{cfg.wk} q8={cfg.q8} slots {slots}]",
                        gemv._q4_0_gemv_kernel, tsig, consts, {"num_warps": cfg.wk, "maxnreg": cfg.maxnreg}))
            if n != 2048:  # moe_gemv_glu: the gate + up rows of a tile (MOE_GLU) and the GLU in the store
                oai = t == GGMLType.MXFP4  # (gpt-oss: its biases and clamped SwiGLU)
                gcfg = moe_gemv_config(2 * n, k, t, slots)
                gconsts = dict(consts, R=gcfg.r, LR=gcfg.lr, LK=32 // gcfg.lr, WK=gcfg.wk, PREFETCH=gcfg.prefetch,
                               Q8X=gcfg.q8, MOE_GLU=True, EPI=5 if oai else 1, MOE_BIAS=oai,
                               ALPHA=1.702 if oai else 0.0, LIMIT=7.0 if oai else 0.0)
                out.append((f"moe_gemv_glu[{t.name} {n}x{k} r{gcfg.r} lr{gcfg.lr} q8={gcfg.q8} slots {slots}]",
                            gemv._q4_0_gemv_kernel, dict(tsig, **q8(gcfg.q8)), gconsts,
                            {"num_warps": gcfg.wk, "maxnreg": gcfg.maxnreg}))
    # the fused epilogues (gemv_fused.py): SwiGLU on the gate+up configs, bias + RoPE on the q+k+v ones
    for mode, (d_t, m_t), lut in [(0, ("*fp16", "*fp16"), False), (2, ("*i16", "*i32"), False),
                                  (5, ("*i8", "*fp16"), True)]:  # Q4_0, Q4_K, IQ4_XS
        for epi, (n, k) in [(1, (37888, 3584)), (3, (4608, 3584)), (1, (28672, 4096)), (2, (6144, 4096))]:
            cfg = gemv.gemv_config(n, k, affine=mode > 0)
            name = (f"gemv[mode {mode}{' lut' if lut else ''} EPI {epi} {n}x{k} r{cfg.r} wk{cfg.wk} split={cfg.split} "
                    f"prefetch={cfg.prefetch}]")
            consts = dict(R=cfg.r, LR=cfg.lr, LK=32 // cfg.lr, WK=cfg.wk, SPLIT=cfg.split > 1, EVEN_K=False,
                          MODE=mode, PREFETCH=cfg.prefetch, PDL=True, Q8X=cfg.q8, **dict(no_planes, EPI=epi, LUT=lut))
            opts = {"num_warps": cfg.wk, "maxnreg": cfg.maxnreg}
            out.append((name + f" q8={cfg.q8}", gemv._q4_0_gemv_kernel,
                        dict(sig, d_ptr=d_t, m_ptr=m_t, **q8(cfg.q8)), consts, opts))
    # the deferred RMSNorm's halves (EPI 6 ADD_NORM, RSTD): the small tile and a split one, Q4_0 and Q4_K
    for mode, (d_t, m_t) in [(0, ("*fp16", "*fp16")), (2, ("*i16", "*i32"))]:
        for n, k, epi, rstd in [(896, 896, 6, 0), (3584, 3584, 6, 0), (9728, 896, 1, 128), (4608, 3584, 3, 128)]:
            cfg = gemv._gemv_config(n, k, affine=mode > 0)
            consts = dict(R=cfg.r, LR=cfg.lr, LK=32 // cfg.lr, WK=cfg.wk, SPLIT=cfg.split > 1, EVEN_K=False,
                          MODE=mode, PREFETCH=cfg.prefetch, PDL=True, Q8X=0,
                          **dict(no_planes, EPI=epi, RSTD=rstd))
            out.append((f"gemv[mode {mode} EPI {epi} RSTD {rstd} {n}x{k} r{cfg.r} split={cfg.split}]",
                        gemv._q4_0_gemv_kernel, dict(sig, d_ptr=d_t, m_ptr=m_t), consts,
                        {"num_warps": cfg.wk, "maxnreg": cfg.maxnreg}))
    sig = {"x_ptr": "*fp32", "qs_ptr": "*i32", "d_ptr": "*fp16", "out_ptr": "*fp32", "M": "i32", "N": "i32",
           "K": "i32", "NKB": "i32", "M_BUCKET": "i32", "magic": "i32", "half_shift": "i32", "COMPUTE": c,
           "BLOCK_M": c, "BLOCK_N": c, "BLOCK_K": c, "GROUP_M": c, "EVEN_K": c}
    for i, cfg in enumerate(q4_0._MATMUL_CONFIGS):
        for compute in (tl.float16, tl.bfloat16) if i == 0 else (tl.float16,):
            kw = cfg.kwargs
            name = f"q4_0_matmul[{kw['BLOCK_M']}x{kw['BLOCK_N']}x{kw['BLOCK_K']} w{cfg.num_warps} {compute}]"
            opts = {"num_warps": cfg.num_warps, "num_stages": cfg.num_stages}
            out.append((name, q4_0._q4_0_matmul_kernel, sig, dict(kw, COMPUTE=compute, EVEN_K=True), opts))
    # the int8 MMQ matmul (mmq.py): every config on Q4_0, the decode / prefill ends on the other types
    words = {2: "*i16", 4: "*i32", 8: "*i32"}
    highs = {1: "*i8", 2: "*i16", 8: "*i32"}
    scales = {0: ("*fp16", "*fp16"), 1: ("*fp16", "*fp16"), 2: ("*i16", "*i32"), 3: ("*i16", "*fp16"),
              4: ("*i16", "*i32"), 5: ("*i8", "*fp16"), 6: ("*u8", "*u8")}
    sig = {"x_ptr": "*fp32", "lo_ptr": None, "hi_ptr": None, "d_ptr": None, "m_ptr": None, "out_ptr": "*fp32",
           "part_ptr": "*fp32", "cnt_ptr": "*i32", "M": "i32", "N": "i32", "K": "i32", "NKB": "i32",
           "M_STRIDE": "i32", "M_BUCKET": "i32", "KB_SPLIT": "i32", "SPLIT": "i32", "magic": "i32", "t0": "i32",
           "t1": "i32", "t2": "i32", "t3": "i32", "sorted_ptr": "*i32", "bexp_ptr": "*i32", "XDIV": "i32",
           "NEXP": "i32", "MOE": c}

    def layout(t):  # (LB, HB, CENTER, MODE); the lookup types: table bytes, center 128
        pt = planes.PLANE_TYPES.get(t)
        if t in lut4.LUT4_TYPES:
            return 8, 0, 128, lut4.LUT4_MODES[t]
        return mmq._Q4_LAYOUT.get(t) or (pt.lb, pt.hb, pt.center, pt.mode)
    layouts = {t: layout(t) for t in mmq.MMQ_TYPES}
    for t, (lb, hb, center, mode) in layouts.items():
        d_t, m_t = scales[mode]
        lut = t in lut4.LUT4_TYPES
        tsig = dict(sig, lo_ptr="*i32" if lut else words[lb], hi_ptr="*i32" if lut else highs.get(hb, words[lb]),
                    d_ptr=d_t, m_ptr=m_t)
        configs = mmq.MMQ_CONFIGS if t.name == "Q4_0" else mmq.MMQ_CONFIGS
        for cfg in configs:
            kw = cfg.kwargs
            name = f"mmq[{t.name} {kw['BLOCK_M']}x{kw['BLOCK_N']} kb{kw['KB']} w{cfg.num_warps}]"
            consts = dict(kw, LB=lb, HB=hb, CENTER=center, MODE=mode, LUT=lut, EVEN=False, MOE=False)
            opts = {"num_warps": cfg.num_warps, "num_stages": cfg.num_stages}
            out.append((name, mmq._mmq_kernel, tsig, consts, opts))
            if t.name in ("Q4_K", "Q6_K", "Q4_0"):  # the grouped expert matmul (moe.py moe_mmq): its MOE mode
                out.append(("moe_" + name, mmq._mmq_kernel, tsig, dict(consts, MOE=True), opts))
        if t.name in ("Q4_0", "Q4_K", "Q6_K", "Q8_0", "Q2_K", "MXFP4"):  # moe.py moe_mm16: its one tile, per layout
            cfg = moe.mm16_config(4096, 128, 768, 2048)
            for bias in (False, True) if t.name == "MXFP4" else (False,):
                msig = {"x_ptr": "*fp32", "lo_ptr": tsig["lo_ptr"], "hi_ptr": tsig["hi_ptr"], "d_ptr": d_t,
                        "m_ptr": m_t, "out_ptr": "*fp32", "b_ptr": "*fp32", "sorted_ptr": "*i32", "bexp_ptr": "*i32",
                        "N": "i32", "K": "i32", "NKB": "i32", "M_STRIDE": "i32", "XDIV": "i32", "NEXP": "i32",
                        "t0": "i32", "t1": "i32", "t2": "i32", "t3": "i32", "LB": c, "HB": c, "CENTER": c,
                        "MODE": c, "LUT": c, "BLOCK_M": c, "BLOCK_N": c, "KB": c, "BIAS": c, "PDL": c,
                        "GLU_OFF": "i32", "GLU": c, "ALPHA": c, "LIMIT": c}
                mconsts = dict(LB=lb, HB=hb, CENTER=center, MODE=mode, LUT=lut, BIAS=bias, PDL=2, GLU=0, ALPHA=0.0,
                               LIMIT=0.0, **{k: cfg[k] for k in ("BLOCK_M", "BLOCK_N", "KB")})
                out.append((f"moe_mm16[{t.name} bias={bias}]", moe._mm16_kernel, msig, mconsts,
                            {"num_warps": cfg["num_warps"], "num_stages": cfg["num_stages"]}))
                # moe_mm16_glu: two dots a step on one x tile, the GLU in the store (gpt-oss's with its biases)
                glu = dict(GLU=5, ALPHA=1.702, LIMIT=7.0) if bias else dict(GLU=1)
                out.append((f"moe_mm16_glu[{t.name} bias={bias}]", moe._mm16_kernel, msig, dict(mconsts, **glu),
                            {"num_warps": cfg["num_warps"], "num_stages": cfg["num_stages"]}))

    sig = {"x_ptr": "*fp32", "w_ptr": "*fp32", "out_ptr": "*fp32", "D": "i32", "stride_x": "i32", "eps": "fp32",
           "BLOCK_D": c, "PDL": c}
    sig.update({"q_ptr": "*i32", "s_ptr": "*fp32", "GROUPS": "i32", "Q8": c})
    for d in (576, 3584, 8192):
        block = 1 << (d - 1).bit_length()
        for q8 in (0, 1, 2):  # the int8 form for the GEMV after it: 1 or 2 passes
            out.append((f"rms_norm[{d} q8={q8}]", norm._rms_norm_kernel, sig, {"BLOCK_D": block, "PDL": 2, "Q8": q8},
                        {"num_warps": 4 if block <= 2048 else 8}))
    sig = {"x_ptr": "*fp32", "y_ptr": "*fp32", "w_ptr": "*fp32", "out_ptr": "*fp32", "sum_ptr": "*fp32", "D": "i32",
           "eps": "fp32", "q_ptr": "*i32", "s_ptr": "*fp32", "wy_ptr": "*fp32", "BLOCK_D": c, "WRITE_SUM": c,
           "Q8": c, "NORM_Y": c, "PDL": c}
    for q8, norm_y in ((0, False), (2, False), (2, True)):  # NORM_Y: gemma's post-norm folded in
        out.append((f"add_rms_norm[3584 q8={q8} norm_y={norm_y}]", norm._add_rms_norm_kernel, sig,
                    {"BLOCK_D": 4096, "WRITE_SUM": True, "Q8": q8, "NORM_Y": norm_y, "PDL": 2}, {"num_warps": 8}))
    sig = {"x_ptr": "*fp32", "pos_ptr": "*i32", "cos_ptr": "*fp32", "sin_ptr": "*fp32", "out_ptr": "*fp32",
           "stride_x": "i32", "N": "i32", "HD": "i32", "HALF": "i32", "NEOX": c, "BLOCK_HALF": c, "BLOCK_HD": c,
           "PDL": c}
    for neox, hd in ((False, 64), (True, 128)):
        out.append((f"rope[neox={neox} hd{hd}]", rope._rope_kernel, sig,
                    {"NEOX": neox, "BLOCK_HALF": hd // 2, "BLOCK_HD": hd, "PDL": 2}, {"num_warps": 1}))
    sig = {"x_ptr": "*fp32", "wq_ptr": "*fp32", "wk_ptr": "*fp32", "pos_ptr": "*i32", "cos_ptr": "*fp32",
           "sin_ptr": "*fp32", "out_ptr": "*fp32", "stride_x": "i32", "N": "i32", "NQ": "i32", "HD": "i32",
           "HALF": "i32", "eps": "fp32", "NEOX": c, "BLOCK_HALF": c, "BLOCK_HD": c, "PDL": c}
    for hd in (128, 256):  # qwen3 and gemma3's head sizes
        out.append((f"norm_rope[neox=True hd{hd}]", rope._norm_rope_kernel, sig,
                    {"NEOX": True, "BLOCK_HALF": hd // 2, "BLOCK_HD": hd, "PDL": 2},
                    {"num_warps": 1 if hd <= 128 else 2}))
    sig = {"k_ptr": "*fp32", "v_ptr": "*fp32", "ck_ptr": "*fp16", "cv_ptr": "*fp16", "slot_ptr": "*i32",
           "pos_ptr": "*i32", "stride_k": "i32", "stride_v": "i32", "layer_off": "i64", "S_STRIDE": "i64",
           "H_STRIDE": "i64", "HD": "i32", "RS": "i32", "BLOCK_D": c, "Q8": c, "PDL": c}
    out.append(("kv_write", attention._kv_write_kernel, sig, {"BLOCK_D": 128, "Q8": False, "PDL": 2}, {"num_warps": 1}))
    out.append(("kv_write[q8_0]", attention._kv_write_kernel, dict(sig, ck_ptr="*i8", cv_ptr="*i8"),
                {"BLOCK_D": 128, "Q8": True, "PDL": 2}, {"num_warps": 1}))
    sig = {"q_ptr": "*fp32", "ck_ptr": "*fp16", "cv_ptr": "*fp16", "slot_ptr": "*i32", "pos_ptr": "*i32",
           "out_ptr": "*fp32", "po_ptr": "*fp32", "pml_ptr": "*fp32", "sink_ptr": "*fp32", "stride_q": "i32",
           "layer_off": "i64", "S_STRIDE": "i64", "H_STRIDE": "i64", "scale": "fp32", "G": "i32", "N_HEAD": "i32",
           "HD": "i32", "RS": "i32", "SPLIT_LEN": "i32", "NSPLIT": "i32", "window": "i32", "softcap": "fp32", "GP": c,
           "BLOCK_D": c, "BLOCK_N": c, "SPLIT": c, "Q8": c, "CAP": c, "SINK": c, "PDL": c}
    # (the last: gpt-oss's head of 64 with its sinks)
    for hd, split, q8, sink in ((64, False, False, False), (128, True, False, False), (128, False, True, False),
                                (64, False, False, True)):
        cache = "*i8" if q8 else "*fp16"
        out.append((f"attention_rows[hd{hd} split={split} q8={q8} sink={sink}]", attention._attn_rows_kernel,
                    dict(sig, ck_ptr=cache, cv_ptr=cache),
                    {"GP": 16, "BLOCK_D": hd, "BLOCK_N": attention.block_n(hd, q8), "SPLIT": split, "Q8": q8,
                     "CAP": False, "SINK": sink, "PDL": 2},
                    {"num_warps": 4}))
    sig = {"q_ptr": "*fp32", "ck_ptr": "*fp16", "cv_ptr": "*fp16", "tiles_ptr": "*i32", "out_ptr": "*fp32",
           "sink_ptr": "*fp32", "stride_q": "i32", "layer_off": "i64", "S_STRIDE": "i64", "H_STRIDE": "i64",
           "scale": "fp32", "G": "i32", "N_HEAD": "i32",
           "HD": "i32", "RS": "i32", "window": "i32", "softcap": "fp32", "BLOCK_M": c, "BLOCK_D": c,
           "BLOCK_N": c, "Q8": c, "CAP": c, "SINK": c, "PDL": c}
    for hd, q8, sink in ((64, False, False), (128, False, False), (64, True, False), (128, True, False),
                         (64, False, True)):
        cache = "*i8" if q8 else "*fp16"
        out.append((f"attention_prefill[hd{hd} q8={q8} sink={sink}]", attention._attn_prefill_kernel,
                    dict(sig, ck_ptr=cache, cv_ptr=cache),
                    {"BLOCK_M": attention.PREFILL_BLOCK_M, "BLOCK_D": hd, "BLOCK_N": attention.prefill_block_n(hd, q8),
                     "Q8": q8, "CAP": False, "SINK": sink, "PDL": 2}, {"num_warps": 4}))
    sig = {"po_ptr": "*fp32", "pml_ptr": "*fp32", "out_ptr": "*fp32", "sink_ptr": "*fp32", "N_HEAD": "i32",
           "HD": "i32", "NSPLIT": "i32", "SP": c, "BLOCK_D": c, "SINK": c, "PDL": c}
    for sink in (False, True):
        out.append((f"attention_combine[sink={sink}]", attention._attn_combine_kernel, sig,
                    {"SP": 8, "BLOCK_D": 128, "SINK": sink, "PDL": 2}, {"num_warps": 1}))
    sig = {"g_ptr": "*fp32", "u_ptr": "*fp32", "z_ptr": "*fp32", "d": "i32", "stride_g": "i32", "stride_u": "i32",
           "ACT": c, "BLOCK_D": c, "PDL": c}
    for act in ("silu", "gelu"):  # SwiGLU and GeGLU rows
        out.append((f"glu_rows_{act}", elementwise._glu_rows_kernel, sig,
                    {"ACT": act, "BLOCK_D": elementwise.BIAS_BLOCK, "PDL": 2}, {}))
    sig = {"l_ptr": "*fp32", "b_ptr": "*fp32", "w_ptr": "*fp32", "id_ptr": "*i32", "E": "i32", "L_STRIDE": "i32",
           "scale": "fp32", "K": c, "KB": c, "BLOCK_E": c, "GATING": c, "NORM": c, "PDL": c}
    for e, k, gating in ((128, 8, 0), (8, 2, 0), (32, 4, 2)):  # qwen3moe, mixtral, gpt-oss-20b
        out.append((f"moe_route[{e} k{k} gating {gating}]", moe._route_kernel, sig,
                    {"K": k, "KB": triton.next_power_of_2(k), "BLOCK_E": e, "GATING": gating, "NORM": True, "PDL": 2},
                    {"num_warps": 4}))
    sig = {"x_ptr": "*fp32", "w_ptr": "*fp16", "id_ptr": "*i32", "out_ptr": "*fp32", "b_ptr": "*fp32", "N": "i32",
           "K": "i32", "XDIV": "i32", "BLOCK_N": c, "BLOCK_K": c, "BIAS": c, "PDL": c}
    for bias in (False, True):
        out.append((f"moe_matmul_f16[bias={bias}]", moe._f16_kernel, sig,
                    {"BLOCK_N": 64, "BLOCK_K": 256, "BIAS": bias, "PDL": 2}, {"num_warps": 4}))
    sig = {"id_ptr": "*i32", "sorted_ptr": "*i32", "bexp_ptr": "*i32", "cursor_ptr": "*i32", "S": "i32", "E": "i32",
           "ROWS": "i32", "NB": "i32", "BLOCK_M": c, "EB": c, "CHUNK": c, "PDL": c}
    out.append(("moe_align", moe._align_kernel, sig, {"BLOCK_M": 16, "EB": 128, "CHUNK": 1024, "PDL": 2},
                {"num_warps": 8}))
    sig = {"out_ptr": "*fp32", "id_ptr": "*i32", "b_ptr": "*fp32", "N": "i32", "BLOCK_N": c, "PDL": c}
    out.append(("moe_expert_bias", moe._expert_bias_kernel, sig, {"BLOCK_N": 256, "PDL": 2}, {"num_warps": 4}))
    sig = {"y_ptr": "*fp32", "w_ptr": "*fp32", "out_ptr": "*fp32", "N": "i32", "K": c, "BLOCK_N": c, "PDL": c}
    out.append(("moe_sum", moe._sum_kernel, sig, {"K": 8, "BLOCK_N": 256, "PDL": 2}, {"num_warps": 4}))
    return out


def resources(cubin: bytes) -> dict[str, int]:
    """REG / STACK / SHARED / LOCAL of the cubin's kernel, from the cuobjdump Triton ships."""
    import triton

    tool = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        run = subprocess.run([str(tool), "-res-usage", f.name], capture_output=True, text=True, check=True)
    text = run.stdout
    return {k: int(v) for k, v in re.findall(r"(REG|STACK|SHARED|LOCAL):(\d+)", text)}


def aligned(fn, sig: dict[str, str]) -> dict:
    """Pointer arguments 16-byte aligned, as Triton specializes them for torch allocations, and an
    element count `n` divisible by 16, as it specializes the flat kernels' usual sizes."""
    hinted = [k for k, v in sig.items() if v.startswith("*") or k == "n"]
    return {(fn.arg_names.index(k),): [["tt.divisibility", 16]] for k in hinted}


def compile_one(index: int) -> tuple[bool, str]:
    """Compile variant `index`: (failed, report line)."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    name, fn, sig, consts, opts = variants()[index]
    try:
        src = ASTSource(fn, sig, consts, aligned(fn, sig))
        kernel = triton.compile(src, target=GPUTarget(*TARGET), options=opts)
        res = resources(kernel.asm["cubin"])
    except Exception as e:  # report every failing variant, not just the first
        return True, f"FAIL {name}: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
    spills = res.get("LOCAL", 0) + res.get("STACK", 0)
    status = "SPILL" if spills else "ok"
    return bool(spills), f"{status:5} {name:48} regs {res.get('REG'):3} smem {kernel.metadata.shared:6} spill {spills}"


def main() -> int:
    if os.environ.get("TRITON_INTERPRET"):
        print("unset TRITON_INTERPRET: this compiles the real kernels", file=sys.stderr)
        return 2
    from concurrent.futures import ProcessPoolExecutor

    only = sys.argv[1] if len(sys.argv) > 1 else ""  # a name substring: compile only those variants
    chosen = [i for i, v in enumerate(variants()) if only in v[0]]
    with ProcessPoolExecutor(max_workers=os.cpu_count() or 1) as pool:  # compiles are CPU-bound
        results = list(pool.map(compile_one, chosen))
    for _, line in results:
        print(line)
    return 1 if any(failed for failed, _ in results) else 0


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
    raise SystemExit(main())
