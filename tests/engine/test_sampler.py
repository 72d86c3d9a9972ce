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
    return Counter(s(logits, []) for _ in range(n))


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
    seq1 = [s1(flat, []) for _ in range(20)]
    seq2 = [s2(flat, []) for _ in range(20)]
    seq3 = [s3(flat, []) for _ in range(20)]
    assert seq1 == seq2
    assert seq1 != seq3


def test_repeat_penalty_divides_positive_multiplies_negative():
    out = apply_repeat_penalty(torch.tensor([2.0, -1.0, 0.5]), [0, 1, 0], 2.0)
    assert out.tolist() == [1.0, -2.0, 0.5]


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
