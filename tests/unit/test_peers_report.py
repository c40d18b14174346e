"""bench/peers_report.py judges SPEC P1-P9 from per-round series, ratios paired by round."""

from __future__ import annotations

import importlib
import json
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from bench.common import show

pytestmark = pytest.mark.timeout(60)

ROOT = Path(__file__).resolve().parents[2]
rep = importlib.import_module("bench.peers_report")
render = importlib.import_module("bench.peers.render")
report_cli = importlib.import_module("bench.report")
if TYPE_CHECKING:
    from bench.peers_report import Bar, Results
LLAMAD, SERVER = rep.LLAMAD, rep.SERVER


def results(**series: list[float]) -> Results:
    r: Results = rep.Results(rounds=3, sizes=(512, 1024, 2048))
    for k, v in series.items():
        r.series[k.replace("__", "/")] = v
    return r


def by_id(r: Results, id_: str, contains: str = "") -> Bar:
    bar: Bar = next(b for b in rep.bars(r) if b.id == id_ and contains in b.what)
    return bar


def test_p1_is_met_only_when_every_round_is_at_most_25_ms() -> None:
    assert by_id(results(ttft__llamad__ram__2048=[12.0, 24.9, 25.0]), "P1", "ms").verdict == "met"
    r = results(ttft__llamad__ram__2048=[20.0, 26.0, 22.0])
    assert by_id(r, "P1", "ms").verdict == "within noise"
    r = results(ttft__llamad__ram__2048=[26.0, 30.0, 27.0])
    assert by_id(r, "P1", "ms").verdict == "ABOVE BAR"


def test_ratios_pair_the_systems_round_by_round() -> None:
    # Round medians alone would say 10/20 = 0.5 (met); paired, round 2's
    # llamad 30 ms against the server's 25 ms is slower: the bar is in the spread.
    r = results(
        ttft__llamad__ram__2048=[10.0, 30.0, 9.0],
        **{"ttft__llama-server__ram-cache__2048": [20.0, 25.0, 18.0]},
    )
    bar = by_id(r, "P1", "llama-server")
    assert bar.verdict == "within noise"
    assert rep.paired([10.0, 30.0, 9.0], [20.0, 25.0, 18.0]) == pytest.approx([0.5, 1.2, 0.5])


def test_a_missing_peer_is_not_measured_and_says_why() -> None:
    r = results(ttft__llamad__ram__2048=[10.0, 11.0, 12.0])
    r.skipped[SERVER] = "not built: /x/llama-server"
    bar = by_id(r, "P1", "llama-server")
    assert bar.verdict.startswith("not measured")
    assert "not built" in bar.verdict
    assert by_id(r, "P3").verdict.startswith("not measured")


def test_a_lower_ratio_bar_uses_the_rounds_spread() -> None:
    r = results(decode__llamad__4=[100.0, 96.0, 110.0], **{"decode__llama-server__4": [100.0] * 3})
    assert by_id(r, "P3").verdict == "within noise"  # 0.96 in one round
    r = results(decode__llamad__1=[95.0, 99.0], **{"decode__llama-server__1": [100.0, 100.0]})
    assert by_id(r, "P4").verdict == "met"  # 0.95 and 0.99 against 0.95


def test_the_largest_measured_size_is_judged_and_named() -> None:
    r = rep.Results(rounds=1, sizes=(512,))
    r.series["ttft/llamad/ram/512"] = [9.0]
    bar = by_id(r, "P1", "ms")
    assert bar.verdict == "met"
    assert "512 tokens" in bar.what


def test_p8_is_not_judged_when_no_continued_save_fired() -> None:
    base = {
        "p8__llamad__saves__p99": [40.0, 41.0],
        "p8__llamad__no saves__p99": [40.0, 40.0],
    }
    fired = results(**base, **{"p8__llamad__saves__saves_continued": [3.0, 2.0]})
    assert by_id(fired, "P8").verdict == "met"
    silent = results(**base, **{"p8__llamad__saves__saves_continued": [3.0, 0.0]})
    assert by_id(silent, "P8").verdict == "not measured (no continued save fired in a round)"


def test_chat_reuse_counts_each_turn_at_most_its_reusable_tokens() -> None:
    # A server reporting more than the turn could reuse is capped at it.
    assert rep.reuse_share([100, 200], [150, 190]) == pytest.approx(290 / 300)
    with pytest.raises(ValueError, match="nothing"):
        rep.reuse_share([], [])


def test_p6_compares_agents_2_to_8_with_llama_server_round_by_round() -> None:
    r = results(
        p6__llamad__others=[400.0, 420.0],
        **{"p6__llama-server__others": [410.0, 400.0]},
        p6__llamad__prefix_ms=[4.0, 12.0],
        p7__llamad__share=[0.99, 0.97],
    )
    # 400/410 met, 420/400 above: the bar lies inside the rounds' spread.
    assert by_id(r, "P6", "llama-server").verdict == "within noise"
    assert by_id(r, "P6", "prefix").verdict == "within noise"
    assert by_id(r, "P7").verdict == "met"
    r = results(**{"p6__llama-server__others": [410.0]}, p6__llamad__others=[300.0])
    assert by_id(r, "P6", "llama-server").verdict == "met"
    # Agent 1's ratio is information only (no bar).
    assert rep.p50_ratio(1000.0, [30.0, 50.0, 40.0, 60.0, 20.0, 45.0, 35.0]) == pytest.approx(0.04)


def test_the_prefix_share_is_ttft_less_queue_and_the_tails_own_prefill() -> None:
    assert rep.prefix_ms(450.0, queue_ms=200.0, prefill_ms=240.0) == pytest.approx(10.0)
    # Agents 5-8 wait 150 ms for a sequence (n_seq_max 4): not the prefix's cost.
    queued = [0.0, 0.0, 0.0, 150.0, 150.0, 150.0, 150.0]
    agents = [
        {"ttft_ms": 100.0 + i + q, "queue_ms": q, "prefill_ms": 90.0} for i, q in enumerate(queued)
    ]
    assert rep.prefix_share_ms(agents) == pytest.approx(13.0)  # 10..16, the median
    with pytest.raises(ValueError, match="no agents"):
        rep.prefix_share_ms([])


def test_p12_pairs_only_rounds_where_llama_server_reused_its_slot() -> None:
    ratios, bad = rep.live_slot_ratios(
        [5.0, 6.0, 5.0], [20.0, 20.0, 20.0], [1.0, 0.0, 1.0], [2047.0, 2047.0, 1000.0], 2048
    )
    assert ratios == [pytest.approx(0.25)]
    assert bad == [2, 3]  # another slot; too few tokens reused
    r = results(
        ttft__llamad__repeat__2048=[5.0, 12.0],
        **{
            "ttft__llama-server__repeat__2048": [20.0, 20.0],
            "same-slot__llama-server__repeat__2048": [1.0, 1.0],
            "cached__llama-server__repeat__2048": [2047.0, 2047.0],
        },
    )
    p12 = by_id(r, "P12", "2048")
    assert (p12.verdict, p12.size) == ("within noise", 2048)  # 0.25 and 0.6 against 0.5
    assert by_id(r, "P12", "512").verdict.startswith("not measured")  # no 512 in this run
    r.series["ttft/llamad/repeat/2048"] = [5.0, 9.0]
    assert by_id(r, "P12", "2048").verdict == "met"
    r.series["same-slot/llama-server/repeat/2048"] = [1.0, 0.0]
    assert by_id(r, "P12", "2048").verdict.startswith("NOT MEASURED (llama-server's repeat")
    r.series["same-slot/llama-server/repeat/2048"] = [1.0, 1.0]
    r.series["ttft/llamad/repeat/2048"] = [15.0, 16.0]
    note = next(n for n in render.notes(r) if n.startswith("P12"))
    assert "15.5 ms" in note and "20.0 ms" in note


def test_p7s_share_of_all_prompt_tokens_is_shown_beside_its_bar_as_information() -> None:
    r = results(p7__llamad__share=[0.99], **{"p7__llamad__share of prompt": [0.86]})
    info = by_id(r, "P7", "all prompt")
    assert (info.measured, info.bar, info.verdict) == ("0.86", "-", "information")
    assert render.notes(r) == []


def test_p1_is_not_measured_when_its_repeat_was_served_live() -> None:
    r = results(
        ttft__llamad__ram__2048=[2.0, 3.0],
        sources__llamad__ram__2048__live=[0.0, 2048.0],
    )
    assert (
        by_id(r, "P1", "ms").verdict == "NOT MEASURED (served live in 1 of 2 rounds: its "
        "idle entry was not displaced)"
    )
    r.series["sources/llamad/ram/2048/live"] = [0.0, 0.0]
    assert by_id(r, "P1", "ms").verdict == "met"


def test_p2_is_met_only_when_every_rounds_first_repeat_was_exact() -> None:
    r = results(
        ttft__llamad__restart__2048=[30.0, 35.0],
        sources__llamad__restart__2048__computed=[0.0, 1.0],  # 1: the held-back token
    )
    assert by_id(r, "P2").verdict == "met"
    r.series["sources/llamad/restart/2048/computed"] = [0.0, 2048.0]
    assert by_id(r, "P2").verdict == "NOT MET (not exact in 1 of 2 rounds)"
    r.series["ttft/llamad/restart/2048"] = [30.0, 45.0]
    r.series["sources/llamad/restart/2048/computed"] = [0.0, 0.0]
    assert by_id(r, "P2").verdict == "within noise"


def test_p1_against_llama_server_is_half_its_ram_cache_hit() -> None:
    r = results(
        ttft__llamad__ram__2048=[10.0, 12.0],
        **{"ttft__llama-server__ram-cache__2048": [20.0, 20.0]},
    )
    assert by_id(r, "P1", "llama-server").verdict == "within noise"  # 0.5 and 0.6
    r.series["ttft/llamad/ram/2048"] = [10.0, 9.0]
    assert by_id(r, "P1", "llama-server").verdict == "met"


def test_the_report_has_every_bar_and_names_skipped_systems() -> None:
    r = results(ttft__llamad__ram__2048=[10.0, 11.0, 12.0])
    r.skipped["llama-cpp-python"] = "pip install of the pinned sdist failed (exit 1)"
    text = render.report(r, plots=["x-ttft.png"])
    for id_ in ("P1", "P2", "P3", "P4", "P5", "P6", "P7", "P8", "P9", "P12"):
        assert f"| {id_} " in text
    assert "**skipped** llama-cpp-python: pip install of the pinned sdist failed" in text
    assert "![x-ttft.png](x-ttft.png)" in text


def test_the_report_says_how_many_server_hits_came_from_its_ram_cache() -> None:
    # A warm hit served by the prefill's own slot reused resident KV, not the
    # host-RAM cache P1 compares against: the file counts those apart.
    r = results(**{"moved__llama-server__ram-cache__2048": [1.0, 0.0, 1.0]})
    r.series["cached/llama-server/ram-cache/2048"] = [2047.0, 2047.0, 2047.0]
    assert "another slot than the prefill's" in render.cached_table(r)
    assert "2 of 3" in render.cached_table(r)


def test_a_missed_bar_gets_a_note_from_the_runs_own_numbers() -> None:
    r = results(
        p6__llamad__prefix_ms=[14.0, 15.0],
        p6__llamad__others=[460.0, 470.0],
        p6__llamad__queue_ms=[200.0, 210.0],
        p6__llamad__prefill_ms=[240.0, 245.0],
        p6__llamad__restore_ms=[2.0, 2.0],
        p6__llamad__wait_ms=[0.0, 0.0],
        p9__llamad__mb=[150.0],
    )
    notes = render.notes(r)
    assert len(notes) == 1  # P9 is met: no note
    assert notes[0].startswith("P6 (8 agents: the prefix's share")
    assert "tail prefill 242.5 ms" in notes[0] and "prefix's share" in notes[0]


def test_the_report_shows_where_llamads_tokens_came_from() -> None:
    r = results(
        sources__llamad__ram__2048__ram=[2048.0, 2048.0],
        sources__llamad__ram__2048__live=[0.0, 0.0],
        sources__llamad__restart__2048__computed=[2048.0, 2048.0],
        ttft__llamad__restart__2048=[6000.0, 6100.0],
    )
    table = render.sources_table(r)
    assert "ram 2048" in table and "computed 2048" in table and "live" not in table
    assert any(n.startswith("P2 (NOT MET") and "computed 2048" in n for n in render.notes(r))


def test_the_plots_are_written_as_png(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    plots = importlib.import_module("bench.peers_plots")
    r = results(decode__llamad__1=[90.0], decode__llamad__4=[150.0])
    r.series["ttft/llamad/ram/512"] = [5.0]
    r.series["ttft/llamad/cold/512"] = [2000.0]
    r.itl_ms = {"saves": [10.0, 12.0, 30.0], "no saves": [10.0, 11.0, 12.0]}
    written = plots.plot_all(r, tmp_path, "x")
    assert [p.name for p in written] == ["x-ttft.png", "x-decode.png", "x-itl.png"]
    for p in written:
        assert p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_recorded_run_renders_the_same_report_and_verdicts_from_its_json() -> None:
    r = results(
        ttft__llamad__ram__2048=[10.0, 12.0, 30.0],
        ttft__llamad__cold__2048=[6000.0, 6100.0, 6200.0],
        **{"ttft__llama-server__ram-cache__2048": [40.0, 40.0, 40.0]},
    )
    r.itl_ms = {"saves": [10.0, 12.0, 30.0], "no saves": [10.0, 11.0, 12.0]}
    r.breakdown = {rep.TOTAL: [10.0, 12.0, 30.0], rep.COPY_FLOOR: [3.0, 3.0, 3.0]}
    r.skipped["llama-cpp-python"] = "--skip"
    r.setup["model"] = "m.gguf"
    params = {"rounds": r.rounds, "sizes": list(r.sizes), "plots": ["x-ttft.png"]}
    data = json.loads(json.dumps(rep.results_data(r)))
    assert rep.results_of(params, data) == r
    text = show("bench.peers.render:render", params, data)
    assert text == render.report(r, plots=["x-ttft.png"])
    # P1 judged from the recorded rounds: one round above 25 ms.
    assert by_id(rep.results_of(params, data), "P1", "ms").verdict == "within noise"
    line = next(x for x in text.splitlines() if x.startswith("| P1  | warm TTFT from a tier"))
    assert line.rstrip(" |").endswith("within noise")


def test_the_peers_result_is_recorded_as_date_machine_json_and_md(tmp_path: Path) -> None:
    bench = importlib.import_module("bench.peers_bench")
    r = results(ttft__llamad__ram__2048=[10.0, 11.0, 12.0])
    path = bench.record_run("2026-11-26-intel-xeon-2c", r, ["x.png"], results=tmp_path)
    assert path == tmp_path / "2026-11-26-intel-xeon-2c.md"
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "2026-11-26-intel-xeon-2c.json",
        "2026-11-26-intel-xeon-2c.md",
    ]
    assert report_cli.main(["--check", str(path.with_suffix(".json"))]) == 0
    text = path.read_text()
    assert "## Machine" in text and "| P1 " in text and "![x.png](x.png)" in text


def test_each_part_of_the_warm_path_is_set_against_the_floor_round_by_round() -> None:
    # Issue 21: the worker reports its restore's parts (lookup_ms, load_ms);
    # the report sets each part against the floor, round by round.
    r = results(ttft__llamad__ram__2048=[12.0, 16.0, 14.0])
    r.breakdown = {
        rep.TOTAL: [12.0, 16.0, 14.0],
        rep.CLIENT: [1.0, 2.0, 1.0],
        rep.RESTORE: [10.0, 13.0, 12.0],
        rep.LOOKUP: [0.5, 0.5, 1.0],
        rep.LOAD: [9.0, 12.0, 10.0],
        rep.PRIMER: [1.0, 1.0, 1.0],
        rep.COPY_FLOOR: [5.0, 6.0, 5.0],
    }
    got = rep.against_floor(r)
    assert got[rep.TOTAL] == (rep.FLOOR_TOTAL, [2.0, 16.0 / 7.0, 14.0 / 6.0])
    assert got[rep.RESTORE] == (rep.COPY_FLOOR, [2.0, 13.0 / 6.0, 12.0 / 5.0])
    assert got[rep.LOAD] == (rep.COPY_FLOOR, [1.8, 2.0, 2.0])
    assert got[rep.LOOKUP] == (rep.FLOOR_TOTAL, [0.5 / 6.0, 0.5 / 7.0, 1.0 / 6.0])
    assert rep.floor_parts(r)[rep.RESTORE_REST] == [0.5, 0.5, 1.0]
    text = render.report(r, plots=[])
    assert "| part of the warm path" in text and "| against" in text
    rows = [x for x in text.splitlines() if x.startswith(f"| {rep.LOAD}")]
    assert len(rows) == 2  # its ms in the breakdown, its ratio against the copy
    assert rep.COPY_FLOOR in rows[1] and "2.00 (1.80-2.00)" in rows[1]
    # No copy past the cache recorded (runs before it): no row against it,
    # and the gap to the bar's floor is there all the same.
    assert rep.TOTAL_PAST_CACHE not in got and rep.FLOOR_PAST_CACHE not in rep.floor_parts(r)
    assert rep.GAP in rep.floor_parts(r)
    # Recorded: the floor made the way a worker copies, and the TTFT against
    # it beside the bar's own floor (which stays the bar's).
    r.breakdown[rep.COPY_PAST_CACHE] = [3.0, 4.0, 3.0]
    got = rep.against_floor(r)
    assert got[rep.TOTAL_PAST_CACHE] == (rep.FLOOR_PAST_CACHE, [3.0, 16.0 / 5.0, 14.0 / 4.0])
    assert got[rep.TOTAL] == (rep.FLOOR_TOTAL, [2.0, 16.0 / 7.0, 14.0 / 6.0])
    assert rep.floor_parts(r)[rep.FLOOR_PAST_CACHE] == [4.0, 5.0, 4.0]
    text = render.report(r, plots=[])
    assert f"| {rep.TOTAL_PAST_CACHE}" in text and "3.20 (3.00-3.50)" in text
    # A run recorded before the worker reported the parts renders as before.
    del r.breakdown[rep.LOAD]
    assert rep.against_floor(r) == {}
    assert "| against" not in render.report(r, plots=[])


def test_https_first_token_bar_is_judged_on_the_back_to_back_runs() -> None:
    # The runs of repeats (each way after its own kind) judge HTTP's cost to
    # the first token; the single first repeat after the cold reply, which
    # lands on the cold reply's finish save being written, is shown as
    # information beside it.
    r = results(
        **{
            "http-run__llamad__http__2048": [1.4, 1.5, 1.3],
            "http-run__llamad__client__2048": [0.8, 0.9, 0.8],
            "http-ttft__llamad__http__repeat__2048": [3.0, 9.0, 1.0],
            "http-ttft__llamad__client__repeat__2048": [2.0, 2.0, 2.4],
        }
    )
    judged = by_id(r, "HTTP", "back-to-back repeats")
    assert judged.verdict == "met"
    assert judged.measured.startswith("0.6")
    first = by_id(r, "HTTP", "first repeat after the cold reply")
    assert first.verdict == rep.INFO
    assert first.measured.startswith("1 (-1.4")
    r.series["http-run/llamad/http/2048"] = [1.4, 2.5, 1.3]
    assert by_id(r, "HTTP", "back-to-back repeats").verdict == "within noise"


def test_the_floor_copy_past_the_cache_runs_in_a_process_started_as_a_worker(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # From another directory: the child finds the bench by the repository's path.
    monkeypatch.chdir(tmp_path)
    scenarios = importlib.import_module("bench.peers.scenarios")
    assert scenarios.copy_ms_past_cache(1 << 20) > 0.0
