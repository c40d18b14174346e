"""bench/numerics_bench.py's paired-burst decode step (issue 16's decode bar):
the burst order, the pair and round ratios, the verdicts computed from every
round, and the probe itself (compiled against this checkout's build: every
burst at a depth decodes the same tokens, so its cells really are removed)."""

from __future__ import annotations

import importlib
import shutil
from pathlib import Path
from typing import Any

import pytest
from bench.common import show

pytestmark = pytest.mark.timeout(120)

nb = importlib.import_module("bench.numerics_bench")


def cells(text: str, first: str) -> list[str]:
    for line in text.splitlines():
        got = [c.strip() for c in line.strip().strip("|").split("|")]
        if line.startswith("|") and got[0] == first:
            return got
    raise AssertionError(f"no row {first!r} in\n{text}")


def test_pairs_alternate_which_side_goes_first() -> None:
    assert nb.burst_order(4) == [
        ("before", "after"),
        ("after", "before"),
        ("before", "after"),
        ("after", "before"),
    ]
    # One pair a round (P5): the rounds take turns at going first.
    assert [nb.burst_order(1, r)[0] for r in range(3)] == [
        ("before", "after"),
        ("after", "before"),
        ("before", "after"),
    ]


def test_a_pairs_ratio_is_after_speed_over_before_speed() -> None:
    # before took 100 ms, after 80 ms: after is 1.25x as fast.
    assert nb.pair_ratios([100.0, 50.0], [80.0, 100.0]) == [1.25, 0.5]
    with pytest.raises(ValueError):
        nb.pair_ratios([1.0, 2.0], [1.0])


def test_a_rounds_ratio_is_the_median_pair_so_one_disturbed_pair_moves_it_little() -> None:
    before = [100.0, 100.0, 100.0, 400.0, 100.0]  # the 4th pair's before burst was preempted
    after = [100.0, 101.0, 99.0, 100.0, 100.0]
    assert nb.round_ratio(before, after) == pytest.approx(1.0)


def _params() -> dict[str, Any]:
    return {
        "rounds": 3,
        "parts": ["bursts"],
        "threads": 2,
        "cores": 2,
        "before": "/b",
        "after": "/a",
        "before_patches": "28f6f998",
        "after_patches": "050be863",
        "depths": [512, 4096],
        "pairs": 2,
        "burst": 8,
        "seed": 16,
    }


def _bursts(ratios: dict[str, list[float]], mismatches: int = 0) -> dict[str, Any]:
    """Rounds whose pairs have the given after/before ratios (before 100 ms a burst)."""
    depths = {
        d: [{"before_ms": [100.0, 100.0], "after_ms": [100.0 / r, 100.0 / r]} for r in rs]
        for d, rs in ratios.items()
    }
    return {
        "depths": depths,
        "tokens": {"before": {d: [1, 2] for d in ratios}, "after": {d: [1, 3] for d in ratios}},
        "mismatches": {"before": mismatches, "after": 0},
        "prefill_ms": {"before": 1000.0, "after": 1000.0},
        "load_start": [3.5, 2.0, 1.0],
        "load_end": [4.25, 2.5, 1.5],
    }


def test_the_verdict_needs_every_round_over_the_bar() -> None:
    data = {"bursts": _bursts({"512": [1.0, 1.2, 0.98], "4096": [0.96, 1.1, 1.2]})}
    text = show(nb.RENDER, _params(), data)
    # 8 tokens in 100 ms = 80 tok/s before; the ratios come from every round.
    assert cells(text, "512") == [
        "512", "80.0", "80.0", "1.000", "0.980-1.200", ">= 0.97", "met",
    ]  # fmt: skip
    assert cells(text, "4096")[3:] == ["1.100", "0.960-1.200", ">= 0.97", "within noise"]
    text = show(nb.RENDER, _params(), {"bursts": _bursts({"512": [0.9, 0.95, 0.96]})})
    assert cells(text, "512")[-1] == "BELOW BAR"


def test_the_report_states_the_load_and_the_token_check() -> None:
    text = show(nb.RENDER, _params(), {"bursts": _bursts({"512": [1.0, 1.0, 1.0]})})
    assert "at the start: 3.5, 2, 1; at the end: 4.25, 2.5, 1.5 (2 cores" in text
    assert "Same tokens in every burst of a probe at a depth: yes, on both builds." in text
    text = show(nb.RENDER, _params(), {"bursts": _bursts({"512": [1.0] * 3}, mismatches=2)})
    assert "NO: mismatching bursts {'before': 2, 'after': 0}." in text


@pytest.mark.skipif(shutil.which("cc") is None, reason="no C compiler")
def test_the_probe_repeats_its_burst_at_a_fixed_depth(tmp_path: Path) -> None:
    from llamad.llama_ffi.build_info import build_record  # noqa: PLC0415

    lib_dir = Path(build_record()["lib_dir"])
    exe = nb.compile_probe(lib_dir, tmp_path, "after")
    probe = nb.Probe(exe, n_ctx=96, threads=1, prefill=48)
    try:
        _, first = probe.burst(3)
        assert len(first) == 3
        _, again = probe.burst(3)
        assert again == first  # the first burst's cells were removed: same depth, same tokens
        probe.depth(16)
        _, shallower = probe.burst(3)
        assert probe.burst(3)[1] == shallower
    finally:
        probe.close()
    assert probe.proc.returncode == 0


def _p5_round(default_ms: float, det_ms: float) -> dict[str, list[dict[str, float]]]:
    def row(ms: float) -> dict[str, float]:
        return {"prefill_ms": ms, "prefill_tokens": 2048.0, "reply_ms": ms + 5}

    return {"default": [row(default_ms)] * 2, "deterministic": [row(det_ms)] * 2}


def test_p5_judges_deterministic_over_default_from_every_round() -> None:
    params = {**_params(), "parts": ["p5"], "p5_pairs": 2, "p5_tokens": 2048}
    # 2,048 tokens in 10.24 s is 200 tok/s; deterministic at 12.8 s is 160 (0.8x).
    rounds = [_p5_round(10240.0, 12800.0), _p5_round(10240.0, 10240.0)]
    data = {"p5": {"rounds": rounds, "load_start": [1.0, 1.0, 1.0], "load_end": [2.0, 1.0, 1.0]}}
    text = show(nb.RENDER, params, data)
    assert cells(text, "P5 cold 2048")[1:] == [
        "200.0", "180.0", "0.900", "0.800-1.000", ">= 0.95", "within noise",
    ]  # fmt: skip
    assert "the governor live" in text


def _p34_round(default_s: float, det_s: float) -> dict[str, dict[str, list[dict[str, float]]]]:
    def row(seconds: float, tokens: float) -> dict[str, float]:
        return {"tokens": tokens, "seconds": seconds}

    return {
        str(n): {
            "default": [row(default_s * n, 63.0 * n)] * 2,
            "deterministic": [row(det_s * n, 63.0 * n)] * 2,
        }
        for n in (1, 4)
    }


def test_p34_judges_deterministic_over_default_decode_from_every_round() -> None:
    params = {**_params(), "parts": ["p34"], "p34_pairs": 2, "p34_tokens": 64}
    # 63 tokens in 1.26 s is 50 tok/s; deterministic at 1.05 s is 60 (1.2x), then equal.
    rounds = [_p34_round(1.26, 1.05), _p34_round(1.26, 1.26)]
    data = {"p34": {"rounds": rounds, "load_start": [1.0, 1.0, 1.0], "load_end": [1.0, 1.0, 1.0]}}
    text = show(nb.RENDER, params, data)
    assert cells(text, "P4: 1 stream")[1:] == [
        "50.0", "55.0", "1.100", "1.000-1.200", ">= 0.95", "met",
    ]  # fmt: skip
    # Four streams, four times the tokens in four times the time: the same speeds.
    assert cells(text, "P3: 4 streams")[1:4] == ["50.0", "55.0", "1.100"]
    slower = [_p34_round(1.26, 1.26 / 0.9), _p34_round(1.26, 1.26)]
    data["p34"]["rounds"] = slower
    assert cells(show(nb.RENDER, params, data), "P4: 1 stream")[-1] == "within noise"
