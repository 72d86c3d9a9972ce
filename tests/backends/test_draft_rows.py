"""What speculative decoding (engine/draft.py, scheduler.py) asks of a backend: a sequence's next
token and its draft tokens run as decode rows of ONE slot at consecutive positions in one step (each
row reads the keys and values the rows before it wrote in that step). On the cpu and vulkan backends
each row equals, bit for bit, the decode step that would have run it alone, so the tokens kept are
exactly those decoding one by one picks (greedy text identical with drafts on and off). The cuda
backend runs several decode rows on its many-row kernels (bf16 operands), not the one-row GEMVs, so
its rows agree to that path's rounding (4.2e-4 relative on tiny-llama q4_0), as its batched decode
rows of different sequences do (tests/backends/test_cuda_backend.py runs `rows_together_and_alone`)."""

from __future__ import annotations

import pytest
import torch

from minfer.api import load
from minfer.backends.base import Batch

PROMPT = [3, 17, 42, 99, 5, 250, 7, 311, 64]
NEXT = [128, 2, 77, 19]  # the tokens fed after the prompt (row i's input)
# the last row against the same tokens run as a fresh prompt (||a - b|| / ||b||), tiny-llama q4_0, 2026-12-03:
# cpu 3.8e-5, vulkan 0, cuda (Triton interpreter) 3.0e-4; a row that read one wrong token of its history: 0.24
FRESH_TOL = 9e-4


def rows_together_and_alone(be, slot: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The logits of NEXT's rows after PROMPT in `slot`: one by one (a decode step each), then all
    in one step as decode rows of that slot; checks the last row against a fresh prompt run."""
    be.forward(Batch.single(PROMPT, 0, slot=slot))
    one = torch.stack([be.forward(Batch.build([(slot, len(PROMPT) + i, [t])], [0], n_decode=1))[0].float().cpu()
                       for i, t in enumerate(NEXT)])
    rows = [(slot, len(PROMPT) + i, [t]) for i, t in enumerate(NEXT)]
    together = be.forward(Batch.build(rows, list(range(len(NEXT))), n_decode=len(NEXT))).float().cpu()
    fresh = be.forward(Batch.single(PROMPT + NEXT, 0, slot=slot))[0].float().cpu()
    assert float((together[-1] - fresh).norm() / fresh.norm()) < FRESH_TOL
    return together, one


@pytest.mark.parametrize("device", ["cpu", "vulkan"])
def test_draft_rows_of_one_slot_equal_decode_steps_one_by_one(tiny_gguf, device):
    # (the cpu's prompt at the decode rows' two int8 passes: the fresh-prompt check's 9e-4 is that precision's)
    with load(tiny_gguf("tiny-llama", "q4_0"), device, n_ctx=64, n_slots=2, cpu_prompt_passes=2, progress=False) as m:
        together, one = rows_together_and_alone(m.engine.backend, 1)
    assert torch.equal(together, one), float((together - one).abs().max())
