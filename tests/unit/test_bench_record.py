"""Every bench records its per-round data as JSON beside its .md, and
``python -m bench.report`` renders the .md again from that JSON (verdicts
recomputed), or checks that it still says the same."""

from __future__ import annotations

import importlib
import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

import bench_samples as samples

pytestmark = pytest.mark.timeout(60)

ROOT = Path(__file__).resolve().parents[2]
common = importlib.import_module("bench.common")
report = importlib.import_module("bench.report")

SAMPLES: dict[str, Callable[[], samples.Sample]] = {
    "actors": samples.actors,
    "cache-io": samples.cache_io,
    "cache-lookup": samples.cache_lookup,
    "cache-view": samples.cache_view,
    "client": samples.client,
    "front-relay": samples.front_relay,
    "ffi": samples.ffi,
    "threads": samples.threads,
    "threads-matrix": samples.threads_matrix,
    "worker-attention": samples.worker_attention,
    "worker-restore": samples.worker_restore,
}

# Every module that records a result, and the renderer each names.
BENCHES = {
    "bench.actors_bench": "bench.actors_bench:render",
    "bench.cache_io_bench": "bench.cache_io_bench:render",
    "bench.cache_lookup_bench": "bench.cache_lookup_bench:render",
    "bench.cache_view_bench": "bench.cache_view_bench:render",
    "bench.client_bench": "bench.client_bench:render",
    "bench.daemon_bench": "bench.daemon_bench_report:render",
    "bench.ffi_bench": "bench.ffi_bench:render",
    "bench.front_relay_bench": "bench.front_relay_bench:report",
    "bench.peers_bench": "bench.peers.render:render",
    "bench.routing_bench": "bench.routing_bench:report",
    "bench.soak": "bench.soak_report:render",
    "bench.threads_bench": "bench.threads_bench:render",
    "bench.worker_bench": "bench.worker_bench_report:render",
    "bench.worker_bench_attention": "bench.worker_bench_attention:render",
    "bench.worker_bench_restore": "bench.worker_bench_restore:render",
}


@pytest.mark.parametrize("module", sorted(BENCHES))
def test_every_bench_names_a_renderer_of_its_own(module: str) -> None:
    assert BENCHES[module] == importlib.import_module(module).RENDER
    assert callable(common.renderer(BENCHES[module]))


def test_record_writes_json_and_md_with_one_stem_and_the_md_is_rendered_from_the_json(
    tmp_path: Path,
) -> None:
    ref, params, data = samples.cache_view()
    path = common.record("cache-view", "Restores", ref, params, data, results=tmp_path)
    stem = path.name.removesuffix(".md")
    assert stem.startswith("cache-view-20") and len(stem) == len("cache-view-2026-11-26")
    assert sorted(p.name for p in tmp_path.iterdir()) == [f"{stem}.json", f"{stem}.md"]
    doc = json.loads((tmp_path / f"{stem}.json").read_text())
    assert doc["format"] == common.FORMAT and doc["bench"] == ref and doc["name"] == stem
    assert doc["params"] == params and doc["data"] == data  # every round, as measured
    assert {"date", "host", "cpu", "cores", "commit"} <= set(doc["machine"])
    md = path.read_text()
    assert md == common.render_doc(doc)
    assert md.startswith("# Restores\n") and "## Machine" in md and "## Results" in md
    assert f"`{stem}.json`" in md
    assert "ram restore 12.00 ms = 1.20x memcpy" in md


def test_an_undated_record_keeps_its_name_as_the_stem(tmp_path: Path) -> None:
    ref, params, data = samples.cache_view()
    path = common.record(
        "2026-11-26-xeon-2c", "t", ref, params, data, results=tmp_path, dated=False
    )
    assert path == tmp_path / "2026-11-26-xeon-2c.md"
    assert (tmp_path / "2026-11-26-xeon-2c.json").is_file()


def test_record_writes_where_the_environment_says(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(common.RESULTS_ENV, str(tmp_path / "elsewhere"))
    ref, params, data = samples.cache_view()
    path = common.record("cache-view", "t", ref, params, data)
    assert path.parent == tmp_path / "elsewhere"
    monkeypatch.delenv(common.RESULTS_ENV)
    assert common.results_dir() == common.RESULTS


def test_the_tests_never_record_into_bench_results() -> None:
    # tests/conftest.py points every test's records at a temporary folder.
    assert common.results_dir() != common.RESULTS
    assert ROOT / "bench" / "results" not in common.results_dir().parents


@pytest.mark.parametrize("name", sorted(SAMPLES))
def test_each_benchs_record_renders_the_same_again_from_its_json(name: str, tmp_path: Path) -> None:
    ref, params, data = SAMPLES[name]()
    path = common.record(name, name, ref, params, data, results=tmp_path)
    assert report.main(["--check", str(path.with_suffix(".json"))]) == 0
    # What an unrecorded run prints is the recorded body.
    assert common.show(ref, params, data).rstrip() in path.read_text()


def test_bench_report_check_passes_on_a_recorded_pair_and_fails_once_the_md_is_edited(
    tmp_path: Path,
) -> None:
    ref, params, data = samples.cache_view()
    md = common.record("cache-view", "Restores", ref, params, data, results=tmp_path)
    js = md.with_suffix(".json")

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "bench.report", *args],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=50,
            check=False,
        )

    ok = run("--check", str(js))
    assert ok.returncode == 0, ok.stdout + ok.stderr
    printed = run(str(js))
    assert printed.returncode == 0 and printed.stdout == md.read_text()
    md.write_text(md.read_text().replace("NOT met", "met").replace(": met", ": NOT met"))
    bad = run("--check", str(js))
    assert bad.returncode == 1
    assert "differs" in bad.stderr
    # The edited line as recorded, and as rendered from the data.
    assert "-- ram restore 12.00 ms = 1.20x memcpy (SPEC: within ~2x of a memcpy): NOT met" in (
        bad.stdout
    )
    assert "+- ram restore 12.00 ms = 1.20x memcpy (SPEC: within ~2x of a memcpy): met" in (
        bad.stdout
    )
    md.unlink()
    assert run("--check", str(js)).returncode == 1


def test_the_verdict_comes_from_the_data_not_from_the_md(tmp_path: Path) -> None:
    # Edit the data of a recorded run: the check fails, the verdict rendered
    # from the edited data says what the data says.
    ref, params, data = samples.cache_view(ram_restore_s=0.012)
    md = common.record("cache-view", "t", ref, params, data, results=tmp_path)
    js = md.with_suffix(".json")
    doc = json.loads(js.read_text())
    doc["data"]["cases"]["ram restore"] = [0.03, 0.03, 0.03]
    js.write_text(common.dumps(doc))
    assert report.main(["--check", str(js)]) == 1
    assert "x memcpy (SPEC: within ~2x of a memcpy): NOT met" in common.render_doc(doc)
    assert ": met" in md.read_text().split("SPEC: within ~2x of a memcpy")[1][:10]


def test_a_result_of_another_format_or_renderer_is_refused(tmp_path: Path) -> None:
    ref, params, data = samples.cache_view()
    doc = {"format": 99, "bench": ref, "name": "x", "title": "t", "machine": {}}
    with pytest.raises(ValueError, match="format"):
        common.render_doc(doc | {"params": params, "data": data})
    with pytest.raises(ValueError, match="not a bench renderer"):
        common.renderer("os:system")
    with pytest.raises(ValueError, match="names no function"):
        common.renderer("bench.common:NOPE")
    bad = tmp_path / "x.json"
    bad.write_text("{")
    assert report.main([str(bad)]) == 1


def test_json_keys_must_be_strings_and_long_lists_stay_on_one_line() -> None:
    with pytest.raises(TypeError, match="512"):
        common.dumps({"ttft": {512: [1.0]}})
    text = common.dumps({"a": list(range(100)), "b": [{"c": list(range(50)), "d": "x" * 90}]})
    assert json.loads(text) == {"a": list(range(100)), "b": [{"c": list(range(50)), "d": "x" * 90}]}
    assert f'"a": {json.dumps(list(range(100)))}' in text


def test_a_histogram_keeps_every_value_to_the_microsecond() -> None:
    h = common.hist([3.2, 2.9, 100.4, 3.0, 7.6])
    assert h == {"us": [3, 8, 100], "n": [3, 1, 1]}
    assert common.unhist(h) == [3.0, 3.0, 3.0, 8.0, 100.0]
    assert common.unhist(h, common.hist([1.0])) == [1.0, 3.0, 3.0, 3.0, 8.0, 100.0]
