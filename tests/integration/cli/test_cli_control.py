"""The control plane commands (load, unload, models, status, counters, cache) on a real daemon."""

from __future__ import annotations

import json
import sys

import pytest

from cli_run import llamad
from daemon_proc import DaemonProc
from llamad import Client, paths
from llamad.cli.errors import EXIT_CONFIG, EXIT_NOT_FOUND, EXIT_USAGE

pytestmark = [pytest.mark.model, pytest.mark.timeout(300)]

ONE_THREAD = ("-o", "n_threads=1", "-o", "n_threads_batch=1", "-o", "n_ctx=512")


def test_models_lists_the_served_model_as_a_table_and_as_json(daemon: DaemonProc) -> None:
    table = llamad(daemon.endpoint, "models")
    assert table.returncode == 0, table.stderr
    header, *rows = table.stdout.splitlines()
    assert header.split()[:3] == ["MODEL", "STATE", "N_CTX"]
    assert any(r.split()[:5] == [daemon.model_id, "ready", "2048", "4", "default"] for r in rows), (
        table.stdout
    )
    as_json = llamad(daemon.endpoint, "models", "--json")
    assert as_json.returncode == 0, as_json.stderr
    models = {m["model_id"]: m for m in json.loads(as_json.stdout)}
    assert models[daemon.model_id]["state"] == "ready"
    assert models[daemon.model_id]["n_seq_max"] == 4
    assert models[daemon.model_id]["deterministic"] is False


def test_load_shows_progress_then_the_model_serves_and_unload_forgets_it(
    daemon: DaemonProc,
) -> None:
    path = str(paths.default_model_path())
    load = llamad(daemon.endpoint, "load", "second", path, *ONE_THREAD, "-o", "deterministic=true")
    assert load.returncode == 0, load.stderr
    # Not a terminal: plain progress lines on stderr, ending at 100%.
    progress = [line for line in load.stderr.splitlines() if line.startswith("loading second: ")]
    assert progress and progress[-1] == "loading second: 100%", load.stderr
    assert load.stdout.startswith("second: ready, n_ctx 512"), load.stdout
    assert "numerics deterministic" in load.stdout, load.stdout
    models = json.loads(llamad(daemon.endpoint, "models", "--json").stdout)
    assert {m["model_id"]: m["state"] for m in models}.get("second") == "ready"
    assert {m["model_id"]: m["deterministic"] for m in models}.get("second") is True
    done = llamad(daemon.endpoint, "complete", "-m", "second", "Hi", "--max-tokens", "2")
    assert done.returncode == 0, done.stderr
    # Two models now: a request must name one.
    ambiguous = llamad(daemon.endpoint, "complete", "Hi", "--max-tokens", "2")
    assert ambiguous.returncode == EXIT_USAGE, ambiguous.stderr
    assert "--model" in ambiguous.stderr

    unload = llamad(daemon.endpoint, "unload", "second")
    assert unload.returncode == 0, unload.stderr
    assert unload.stdout == "unloaded second\n"
    models = json.loads(llamad(daemon.endpoint, "models", "--json").stdout)
    assert "second" not in {m["model_id"] for m in models}
    again = llamad(daemon.endpoint, "unload", "second")
    assert again.returncode == EXIT_NOT_FOUND, again.stderr
    assert again.stderr.startswith("llamad: model_not_found: ")


def test_load_refusals_exit_as_configuration_naming_the_key(daemon: DaemonProc) -> None:
    outside = llamad(daemon.endpoint, "load", "bad", "/etc/hostname")
    assert outside.returncode == EXIT_CONFIG, outside.stderr
    assert outside.stderr.startswith("llamad: path_not_allowed: models.bad.path"), outside.stderr
    option = llamad(
        daemon.endpoint, "load", "bad", str(paths.default_model_path()), "-o", "n_ctx=lots"
    )
    assert option.returncode == EXIT_CONFIG, option.stderr
    assert option.stderr.startswith("llamad: config_error: "), option.stderr
    assert "models.bad.n_ctx" in option.stderr
    assert len(option.stderr.strip().splitlines()) == 1


def test_status_shows_models_processes_and_tiers(daemon: DaemonProc) -> None:
    run = llamad(daemon.endpoint, "status")
    assert run.returncode == 0, run.stderr
    text = run.stdout
    assert text.startswith(f"daemon  pid {daemon.pid}, up "), text
    first = text.splitlines()[0]
    assert f", http {daemon.http_url()}," in first, first
    assert ", kv events ipc://" in first, first
    for section in ("\nmodels\n", "\nprocesses\n", "\ncache tiers\n"):
        assert section in text
    models = text.split("\nmodels\n")[1].split("\nprocesses\n")[0]
    assert any(line.split()[0] == daemon.model_id for line in models.splitlines()[1:]), models
    processes = text.split("\nprocesses\n")[1]
    children = (
        "cache_sup",
        "model_sup",
        "front",
        "gateway",
        "cache-meta",
        f"model.{daemon.model_id}",
    )
    for child in children:
        assert f" {child} " in processes, processes
    tiers = text.split("\ncache tiers\n")[1]
    assert any(line.startswith("ram ") for line in tiers.splitlines()), tiers

    as_json = json.loads(llamad(daemon.endpoint, "status", "--json").stdout)
    assert as_json["pid"] == daemon.pid
    assert as_json["http"] == daemon.http_url()
    assert {m["info"]["model_id"] for m in as_json["models"]} >= {daemon.model_id}
    assert {s["name"] for s in as_json["supervisors"]} >= {"llamad", "cache_sup", "model_sup"}
    assert as_json["tiers"]["ram"]["quota"] == 256 << 20

    one = json.loads(llamad(daemon.endpoint, "status", daemon.model_id, "--json").stdout)
    assert one["info"]["model_id"] == daemon.model_id
    assert one["worker"]["status"]["phase"] == "idle"


def test_counters_and_cache_maintenance(daemon: DaemonProc) -> None:
    prompt = "A long story about copper mirrors in a garden of paper lamps and stones."
    with Client(daemon.endpoint) as client:
        done = client.complete(daemon.model_id, prompt, max_tokens=4, temperature=0.0)
    daemon.wait_saved(done.finish_key)
    counters = json.loads(llamad(daemon.endpoint, "counters", "--json").stdout)
    assert counters["saves_finish"] >= 1
    assert counters["bytes_ram"] > 0
    table = llamad(daemon.endpoint, "counters")
    assert table.returncode == 0, table.stderr
    assert any(
        line.split()[:2] == ["saves_finish", str(counters["saves_finish"])]
        for line in table.stdout.splitlines()
    ), table.stdout

    gc = llamad(daemon.endpoint, "cache", "gc", "--json")
    assert gc.returncode == 0, gc.stderr
    assert set(json.loads(gc.stdout)) == {"evicted", "bytes_freed", "missing", "reaped"}

    evict = llamad(daemon.endpoint, "cache", "evict", "1GiB", "--tier", "ram", "--json")
    assert evict.returncode == 0, evict.stderr
    body = json.loads(evict.stdout)
    assert body["requested"] == 1 << 30
    assert body["bytes_freed"] >= counters["bytes_ram"]
    after = json.loads(llamad(daemon.endpoint, "counters", "--json").stdout)
    assert after["bytes_ram"] == 0
    assert after["evictions"] > counters["evictions"]

    everything = llamad(daemon.endpoint, "cache", "evict", str(sys.maxsize), "--json")
    assert everything.returncode == 0, everything.stderr
    assert json.loads(everything.stdout)["requested"] == sys.maxsize

    bad = llamad(daemon.endpoint, "cache", "evict", "lots")
    assert bad.returncode == EXIT_USAGE, bad.stderr
