"""bench/soak.py's verdict on synthetic samples (the soak itself runs on the GPU machine): warm-up
is found where RSS stops rising, a leak never reaches a steady state, and growth or a tok/s drift
after warm-up fails the run."""

from __future__ import annotations

import importlib.util

import pytest

from .conftest import ROOT


@pytest.fixture(scope="module")
def soak():
    spec = importlib.util.spec_from_file_location("soak", ROOT / "bench" / "soak.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def samples(minutes: int, rss, tok_s=lambda t: 100.0, every: float = 5.0) -> list[dict]:
    """A sample every `every` s: both processes' RSS `rss(t)`, tokens integrated from `tok_s(t)`."""
    out, tokens = [], 0.0
    for i in range(int(minutes * 60 / every) + 1):
        t = i * every
        out.append({"t": t, "server_rss_mb": rss(t), "engine_rss_mb": 2 * rss(t), "tokens": tokens, "5xx": 0})
        tokens += tok_s(t) * every
    return out


def test_warmup_ends_where_rss_stops_rising(soak):
    xs = samples(10, lambda t: 500 + min(t, 120))  # +1 MB/s for two minutes, then flat at 620 MB
    # the first sample whose next minute rises less than the tolerance: at 115 s (615 MB) the 5 MB
    # still to come are < 1 %; at 85 s (585 MB) the 35 MB to come are < 6 %
    assert xs[soak.warmup_end(xs, 60, 1.0)]["t"] == 115
    assert xs[soak.warmup_end(xs, 60, 6.0)]["t"] == 85
    flat = samples(3, lambda t: 500.0, every=5.1)  # (a real sampler's period does not divide the window)
    assert soak.warmup_end(flat, 30, 1.0) == 0


def test_a_leak_has_no_steady_state(soak):
    xs = samples(10, lambda t: 500 + t * 0.2)  # 12 MB a minute, for ever: > 1 % in every minute
    assert soak.warmup_end(xs, 60, 1.0) is None
    v = soak.verdict(xs, {"server_rss_mb": 620, "engine_rss_mb": 1240}, 0, 0, True, 60, 1.0)
    assert not v["ok"] and "no steady state" in v["why"][0]


def test_verdict_passes_a_flat_run_and_names_each_failure(soak):
    xs = samples(10, lambda t: 500 if t < 60 else 560)  # one step up in the first minute
    end = {"server_rss_mb": 560, "engine_rss_mb": 1120}
    v = soak.verdict(xs, end, 0, 0, True, 60, 1.0)
    assert v["ok"], v["why"]
    assert v["warmup_end_s"] == 60 and v["rss_growth_pct"] == {"server_rss_mb": 0.0, "engine_rss_mb": 0.0}
    assert v["tok_s_per_minute"] == [100.0] * 9
    grown = {"server_rss_mb": 560 * 1.06, "engine_rss_mb": 1120}
    assert soak.verdict(xs, grown, 0, 0, True, 60, 1.0)["why"] == [
        "server_rss_mb grew +6.0 % after warm-up (limit 5 %)"]
    slower = samples(10, lambda t: 500 if t < 60 else 560, tok_s=lambda t: 100.0 if t < 300 else 80.0)
    assert soak.verdict(slower, end, 0, 0, True, 60, 1.0)["why"] == [
        "tok/s drifted -20 % from the first minute after warm-up to the last"]
    assert soak.verdict(xs, end, 3, 2, False, 60, 1.0)["why"] == [
        "3 responses >= 500", "2 slots held after the clients stopped", "the server exited"]
    # valid requests refused (the 2026-12-03 H200 soak: the server's -c read as per-slot, 16 tokens a slot)
    refused = {"stream 4xx": 141945, "whole 4xx": 17552, "stream 2xx": 9, "whole 2xx": 2, "malformed 4xx": 15166}
    assert soak.verdict(xs, end, 0, 0, True, 60, 1.0, refused)["why"] == [
        "159497 of 159508 valid requests answered 4xx (limit 1 %)"]
    served = {"stream 2xx": 990, "whole 2xx": 9, "stream 4xx": 1, "malformed 4xx": 500, "cancelled": 40}
    assert soak.verdict(xs, end, 0, 0, True, 60, 1.0, served)["ok"]
