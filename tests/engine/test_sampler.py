"""Sampler behaviour against hand-computed distributions."""

from __future__ import annotations

import math
from collections import Counter

import pytest
import torch

from minfer.engine.sampler import Sampler, SamplingParams, apply_repeat_penalty
from minfer.errors import MinferError

# probabilities 0.5, 0.3, 0.15, 0.05 (then two tokens with ~0 mass)
PROBS = [0.5, 0.3, 0.15, 0.05]
LOGITS = torch.tensor([math.log(p) for p in PROBS] + [-30.0, -31.0])


def _draws(params: SamplingParams, n: int, logits=LOGITS) -> Counter:
    s = Sampler(params)
    return Counter(s(logits, [], i) for i in range(n))  # token i of one sequence: its own uniform draw


def test_greedy_is_argmax():
    logits = torch.tensor([0.1, 3.0, 2.9, -1.0])
    assert Sampler(SamplingParams(temperature=0))(logits, []) == 1


def test_top_k_one_is_argmax_at_any_temperature():
    assert set(_draws(SamplingParams(temperature=5.0, top_k=1, top_p=1.0, min_p=0.0), 50)) == {0}


def test_top_k_limits_the_support():
    c = _draws(SamplingParams(temperature=1.0, top_k=3, top_p=1.0, min_p=0.0, seed=1), 600)
    assert set(c) == {0, 1, 2}


def test_top_p_keeps_the_smallest_prefix_reaching_p():
    # cumulative 0.5, 0.8, 0.95: p = 0.75 needs tokens 0 and 1
    c = _draws(SamplingParams(temperature=1.0, top_k=0, top_p=0.75, min_p=0.0, seed=2), 400)
    assert set(c) == {0, 1}
    assert abs(c[0] / 400 - 0.5 / 0.8) < 0.08


def test_min_p_drops_tokens_below_a_fraction_of_the_best():
    # threshold 0.2 * 0.5 = 0.1: keeps 0.5, 0.3, 0.15
    c = _draws(SamplingParams(temperature=1.0, top_k=0, top_p=1.0, min_p=0.2, seed=3), 600)
    assert set(c) == {0, 1, 2}


def test_temperature_reshapes_the_distribution():
    t = 2.0
    n = 4000
    c = _draws(SamplingParams(temperature=t, top_k=0, top_p=1.0, min_p=0.0, seed=4), n)
    want = torch.softmax(LOGITS / t, 0)
    for i in range(4):
        assert abs(c[i] / n - want[i].item()) < 0.03


def test_seed_reproduces_and_differs():
    p = dict(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0)
    flat = torch.zeros(1000)
    s1, s2, s3 = (Sampler(SamplingParams(seed=s, **p)) for s in (7, 7, 8))
    seq1 = [s1(flat, [], i) for i in range(20)]
    seq2 = [s2(flat, [], i) for i in range(20)]
    seq3 = [s3(flat, [], i) for i in range(20)]
    assert seq1 == seq2
    assert seq1 != seq3


def test_repeat_penalty_divides_positive_multiplies_negative():
    out = apply_repeat_penalty(torch.tensor([2.0, -1.0, 0.5]), [0, 1, 0], 2.0)
    assert out.tolist() == [1.0, -2.0, 0.5]


def test_a_masked_token_stays_masked_under_a_vanishing_repeat_penalty():
    """5e-324 is a valid repeat_penalty (> 0) that is 0 in float32: a grammar-masked (-inf) token in the
    history must stay -inf, not become -inf * 0 = NaN, which greedy's argmax would pick (the schema
    fuzz found it: a 500 "its grammar refused token")."""
    logits = torch.tensor([float("-inf"), 1.0, -2.0, float("-inf")])
    out = apply_repeat_penalty(logits, [0, 2, 3], 5e-324)
    assert out[0] == float("-inf") and out[3] == float("-inf") and not out.isnan().any()
    assert Sampler(SamplingParams(temperature=0.0, repeat_penalty=5e-324))(logits, [0, 2, 3]) == 1


def test_repeat_penalty_changes_greedy_choice_only_within_window():
    logits = torch.tensor([3.0, 2.0, 0.0])
    greedy = dict(temperature=0, repeat_penalty=2.0)
    assert Sampler(SamplingParams(repeat_last_n=2, **greedy))(logits, [0, 2]) == 1
    assert Sampler(SamplingParams(repeat_last_n=1, **greedy))(logits, [0, 2]) == 0


@pytest.mark.parametrize("bad", [dict(temperature=-1), dict(top_p=0), dict(top_p=1.5), dict(min_p=2),
                                 dict(top_k=-1), dict(max_tokens=-1), dict(repeat_penalty=0),
                                 dict(stop=("",))])
def test_bad_parameters_are_typed_errors(bad):
    with pytest.raises(MinferError):
        SamplingParams(**bad)


def test_single_stop_string_is_accepted():
    assert SamplingParams(stop="END").stop == ("END",)


def test_the_uniform_draw_is_one_hash_on_host_and_device():
    """uniform_py (Python ints) and uniform (int64 tensors, what the device runs) agree bit for bit,
    seeds up to 2^64 - 1; the draws are spread over [0, 1)."""
    from minfer.kernels.sample import uniform
    from minfer.rng import uniform as uniform_py

    seeds = [0, 1, 7, 2**31 - 1, 2**32 + 5, 2**63 - 1, 2**63 + 11, 2**64 - 1]
    idx = list(range(0, 4000, 97))
    pairs = [(s, i) for s in seeds for i in idx]
    host = [uniform_py(s, i) for s, i in pairs]
    signed = [s - 2**64 if s >= 2**63 else s for s, _ in pairs]
    dev = uniform(torch.tensor(signed, dtype=torch.int64), torch.tensor([i for _, i in pairs], dtype=torch.int64))
    assert dev.tolist() == host
    assert 0.0 <= min(host) and max(host) < 1.0 and abs(sum(host) / len(host) - 0.5) < 0.05


@pytest.mark.parametrize("params", [dict(temperature=0.8), dict(temperature=1.3, top_k=5, top_p=0.9, min_p=0.0),
                                    dict(temperature=0.5, top_k=64, top_p=1.0, min_p=0.1), dict(temperature=0)])
def test_sample_rows_picks_what_the_host_sampler_picks(params):
    """The device's Sample kernel (here on CPU tensors) against the host Sampler, row by row, for
    rows of mixed parameters in one call."""
    from minfer.kernels.sample import pack_params, sample_rows

    gen = torch.Generator().manual_seed(3)
    logits = torch.randn(12, 500, generator=gen) * 3
    samplers = [Sampler(SamplingParams(seed=100 + r, **params)) for r in range(12)]
    rows = [(sp.params.top_k, sp.params.temperature, sp.params.top_p, sp.params.min_p, sp.seed, 5 + r)
            for r, sp in enumerate(samplers)]
    got = sample_rows(logits, pack_params(rows)).tolist()
    assert got == [sp(logits[r], [], 5 + r) for r, sp in enumerate(samplers)]
