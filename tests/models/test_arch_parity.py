"""Architecture parity: our logits equal HF transformers' on the same tiny synthetic GGUF.

transformers (test-only dependency, used offline) dequantizes the GGUF itself and runs its own
llama / qwen2 implementation (un-permuting llama's Q/K rows, rotate-half RoPE, q/k/v biases for
qwen2), so agreement checks our metadata reading, tensor mapping, RoPE style, GQA, biases, tied
or separate output, all at float32 (relative error < 1e-4). The quantized files check the
same through the cpu backend's quantized kernels (the VNNI kernel's int8 activations for Q4/Q8_0
prompts, torch's int4 kernel on bfloat16 activations for the other types: < 2e-2, the precision
the cpu contracts declare), prefill and token by token.
"""

from __future__ import annotations

import os

import pytest
import torch

from minfer.config import EngineConfig
from minfer.engine.engine import Engine
from minfer.gguf.reader import GGUFReader

IDS = [3, 17, 42, 99, 5, 250, 7, 311, 64, 128, 2, 77, 400, 9, 33, 180, 21, 8, 305, 150, 6, 44, 97, 260]


@pytest.fixture(scope="module")
def hf_logits():
    mp = pytest.MonkeyPatch()  # (undone after the module: the variable must not reach later tests' subprocesses)
    mp.setenv("HF_HUB_OFFLINE", os.environ.get("HF_HUB_OFFLINE", "1"))  # everything is local: never reach for the hub
    import transformers  # test-only dependency (pyproject [test])

    def run(path) -> torch.Tensor:
        model = transformers.AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name,
                                                                  dtype=torch.float32)
        with torch.no_grad():
            return model(torch.tensor([IDS])).logits[0].float()

    yield run
    mp.undo()


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm())


@pytest.mark.parametrize("preset", ["tiny-llama", "tiny-qwen2"])
@pytest.mark.parametrize("quant", ["f32", "f16", "q8_0", "q4_1", "q4_k", "q4_k_m", "q5_k_m", "q6_k", "q5_0",
                                   "q5_1", "q3_k", "q2_k"])
def test_logits_match_transformers(tiny_gguf, hf_logits, raw, preset, quant):
    path = tiny_gguf(preset, quant)
    ref = hf_logits(path)
    eng = Engine.load(GGUFReader(path), EngineConfig(n_slots=1, n_ctx=64), progress=False)
    ours = raw.prefill(eng, 0, IDS)
    rel = _rel(ours, ref)
    print(f"{preset} {quant}: relative error {rel:.2e}")
    # 2-3 bit K-quants: the bfloat16 zero of their large group offsets rounds more (cpu_matmul contract: 3e-2)
    tol = 1e-4 if quant in ("f32", "f16") else 5e-2 if quant in ("q2_k", "q3_k") else 2e-2
    assert rel < tol
    # generation's token-by-token path agrees too
    steps = [raw.prefill(eng, 0, IDS[:4])[-1]] + [raw.decode(eng, 0, t, p) for p, t in enumerate(IDS[4:], start=4)]
    assert _rel(torch.stack(steps), ref[3:]) < tol
