"""SmolLM2 on the avx2 build of the cpu C kernels (MINFER_CPU_ISA=avx2, EngineConfig.cpu_isa) against
the avx512 build: the same bits end to end (the kernels' own comparisons: tests/native/test_c_kernels.py)."""

from __future__ import annotations

import pytest

from minfer.kernels.cpu import vnni as cpu_vnni


def test_a_model_on_the_avx2_build_gives_the_avx512_bits(smollm2_path):
    """SmolLM2 end to end (prompt, greedy decode, every step's top-20 log-probabilities) with the
    avx2 build forced: the avx512 build's tokens and numbers bit for bit."""
    from minfer.api import load
    from minfer.engine.params import SamplingParams

    builds = []
    for i in ("avx512", "avx2"):
        with cpu_vnni.isa_forced(i) as got:
            builds += [got] if got == i else []
    if builds != ["avx512", "avx2"]:
        pytest.skip(f"needs the avx512 and avx2 builds (this host runs {builds})")
    runs = []
    try:
        for isa in builds:
            with load(smollm2_path, n_ctx=256, n_slots=2, progress=False, cpu_isa=isa) as m:
                assert m.engine.backend.cpu_isa == isa
                seq = m.submit("The capital of France is", SamplingParams(max_tokens=12, temperature=0))
                seq.logprobs_n = 20
                m.run([seq])
                runs.append((list(seq.generated), seq.logprobs))
    finally:
        cpu_vnni.use_isa("auto")
    assert runs[0][0] and runs[1] == runs[0]
