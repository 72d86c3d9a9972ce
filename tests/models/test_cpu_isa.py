"""SmolLM2 on the avx2 and amx builds of the cpu C kernels (MINFER_CPU_ISA, EngineConfig.cpu_isa) against
the avx512 build: the same bits end to end (the kernels' own comparisons: tests/native/test_c_kernels.py)."""

from __future__ import annotations

import pytest

from minfer.kernels.cpu import vnni as cpu_vnni


@pytest.mark.parametrize("other", ["avx2", "amx"])
def test_a_model_on_another_build_gives_the_avx512_bits(smollm2_path, other):
    """SmolLM2 end to end (a 38-token prompt: the amx build's tile path takes its 32-row block, greedy
    decode, every step's top-20 log-probabilities) with the avx2 or amx build forced: the avx512 build's
    tokens and numbers bit for bit."""
    from minfer.api import load
    from minfer.engine.params import SamplingParams

    builds = []
    for i in ("avx512", other):
        with cpu_vnni.isa_forced(i) as got:
            builds += [got] if got == i else []
    if builds != ["avx512", other]:
        pytest.skip(f"needs the avx512 and {other} builds (this host runs {builds})")
    prompt = ("The capital of France is Paris. The capital of Italy is Rome. The capital of Spain is Madrid. "
              "The capital of Portugal is Lisbon. The capital of Austria is Vienna. The capital of Germany is")
    runs = []
    try:
        for isa in builds:
            with load(smollm2_path, n_ctx=256, n_slots=2, progress=False, cpu_isa=isa) as m:
                assert m.engine.backend.cpu_isa == isa
                seq = m.submit(prompt, SamplingParams(max_tokens=12, temperature=0))
                assert len(seq.prompt) >= 32, len(seq.prompt)
                seq.logprobs_n = 20
                m.run([seq])
                runs.append((list(seq.generated), seq.logprobs))
    finally:
        cpu_vnni.use_isa("auto")
    assert runs[0][0] and runs[1] == runs[0]
