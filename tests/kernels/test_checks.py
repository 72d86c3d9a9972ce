"""The launcher checks: torch-written kernels run on any one device, Triton launchers only on the
device their kernels compile for."""

from __future__ import annotations

import pytest
import torch

from minfer.errors import DeviceError
from minfer.kernels.sample import pack_params, sample_rows
from minfer.kernels.triton import _common


def test_sample_rows_runs_on_host_tensors_where_compiled_triton_launchers_refuse_them(monkeypatch):
    """As without the interpreter (the vulkan backend's sampled rows, on a machine with Triton):
    sample_rows takes host tensors, a Triton launcher still refuses them."""
    from minfer.kernels.triton.elementwise import add_f32

    monkeypatch.setattr(_common, "_WANTED_DEVICE", "cuda")
    logits = torch.tensor([[0.0, 3.0, 1.0, -2.0], [5.0, 0.0, 0.0, 9.0]])
    params = pack_params([(40, 0.0, 1.0, 0.0, 1, 0), (1, 0.8, 0.95, 0.05, 7, 3)])  # greedy; top-k 1 = argmax
    assert sample_rows(x=logits, params=params).tolist() == [1, 3]
    with pytest.raises(DeviceError, match="compiled Triton kernels need cuda tensors, got tensors on cpu"):
        add_f32(torch.ones(4), torch.ones(4))


def test_sample_rows_refuses_tensors_on_different_devices():
    params = pack_params([(1, 0.5, 1.0, 0.0, 1, 0)])
    with pytest.raises(DeviceError, match="all tensors must be on one device"):
        sample_rows(x=torch.zeros(1, 4), params=params, out=torch.empty(1, dtype=torch.int32, device="meta"))
