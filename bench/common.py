"""Shared helpers for benchmarks: machine description, stats, recording results.

**Result files.** A bench records a run with :func:`record`, which writes two
files with one stem, ``<name>-<date>`` (the peers bench: ``<date>-<machine>``),
into ``bench/results/`` (or the folder named by ``$LLAMAD_BENCH_RESULTS``, or
its ``results`` argument: tests and smoke runs record into a temporary
folder):

- ``<stem>.json``, the run itself::

      {
       "format": 1,
       "bench": "bench.actors_bench:render",   # how to render it: module:function
       "name": "actors-2026-11-26",             # the stem
       "title": "Actor runtime: ...",
       "machine": {"date": ..., "host": ..., "cpu": ..., "commit": ..., ...},
       "params": {...},                         # what the run was asked and ran with
       "data": {...}                            # what it measured, every round of it
      }

  ``data`` holds every round's measured values, not their medians: each
  round's times, rates and counts as measured; many per-call latencies of one
  round as a histogram at 1 µs (:func:`hist`: ``{"us": [value, ...], "n":
  [count, ...]}``, which :func:`unhist` expands back into the values).
  Every value is in the unit its key names (``_s``, ``_ms``, ``_us``), or the
  one the bench's ``render`` documents; keys are strings. Written by
  :func:`dumps`: one member a line, a list of numbers on one line.

- ``<stem>.md``, the report: ``# title``, the machine, and the body that
  ``bench``'s function renders from ``params`` and ``data`` alone
  (``render(params, data) -> str``), tables and verdicts included. A verdict
  is computed there, from the per-round data, never carried as text.

:func:`record` renders the ``.md`` from the JSON text it writes (read back),
so ``python -m bench.report <stem>.json --check`` (:mod:`bench.report`)
renders the same ``.md`` from the committed JSON, and says so, or shows the
difference. A run that is not recorded prints the same body (:func:`show`,
also read back from JSON), so every bench's data goes through the same path
on every run.
"""

from __future__ import annotations

import datetime as _dt
import importlib
import json
import os
import platform
import statistics
import subprocess
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parent / "results"
RESULTS_ENV = "LLAMAD_BENCH_RESULTS"  # a folder to record into instead of bench/results
FORMAT = 1  # the JSON result's "format"


def machine() -> dict[str, str]:
    """What the numbers were measured on."""
    cpu = platform.processor() or "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    try:
        mem_kb = next(
            int(line.split()[1])
            for line in Path("/proc/meminfo").read_text().splitlines()
            if line.startswith("MemTotal")
        )
        mem = f"{mem_kb / 1024 / 1024:.1f} GiB"
    except (OSError, StopIteration):
        mem = "unknown"
    try:
        rev = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=False
        ).stdout.strip()
    except OSError:
        rev = ""
    return {
        "date": _dt.datetime.now(_dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "host": platform.node(),
        "kernel": platform.release(),
        "cpu": cpu,
        "cores": str(os.cpu_count()),
        "memory": mem,
        "python": platform.python_version(),
        "commit": rev or "unknown",
    }


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100) of a non-empty sample."""
    ordered = sorted(values)
    rank = max(0, min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1))))
    return ordered[rank]


def median(values: Sequence[float]) -> float:
    return statistics.median(values)


def table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """A markdown table."""
    cells = [[str(h) for h in headers], *[[str(c) for c in r] for r in rows]]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    fmt = "| " + " | ".join(f"{{:<{w}}}" for w in widths) + " |"
    lines = [fmt.format(*cells[0]), "|" + "|".join("-" * (w + 2) for w in widths) + "|"]
    lines += [fmt.format(*r) for r in cells[1:]]
    return "\n".join(lines)


Render = Callable[[Mapping[str, Any], Mapping[str, Any]], str]


def hist(values: Iterable[float]) -> dict[str, list[int]]:
    """Many values (a round's per-call latencies, in µs) kept to the unit:
    each distinct rounded value once, with its count."""
    counts = Counter(round(v) for v in values)
    keys = sorted(counts)
    return {"us": keys, "n": [counts[k] for k in keys]}


def unhist(*hists: Mapping[str, Sequence[int]]) -> list[float]:
    """The values of one or more :func:`hist` histograms, in order."""
    out: list[float] = []
    for h in hists:
        for value, n in zip(h["us"], h["n"], strict=True):
            out += [float(value)] * n
    out.sort()
    return out


def results_dir(results: Path | None = None) -> Path:
    """Where :func:`record` writes: ``results``, else ``$LLAMAD_BENCH_RESULTS``,
    else ``bench/results``."""
    if results is not None:
        return results
    env = os.environ.get(RESULTS_ENV)
    return Path(env) if env else RESULTS


def _check_keys(value: object, where: str = "doc") -> None:
    if isinstance(value, Mapping):
        for k, v in value.items():
            if not isinstance(k, str):
                raise TypeError(f"{where}: key {k!r} is not a string")
            _check_keys(v, f"{where}.{k}")
    elif isinstance(value, (list, tuple)):
        for i, v in enumerate(value):
            _check_keys(v, f"{where}[{i}]")


def dumps(doc: object) -> str:
    """``doc`` as JSON text meant to be read: objects one member a line, a list
    of numbers or strings (or anything short) on one line. Keys must be strings
    (``json`` would turn ``512`` into ``"512"`` behind the reader's back)."""
    _check_keys(doc)

    def enc(v: object, ind: int) -> str:
        flat = json.dumps(v, ensure_ascii=False)
        nested = isinstance(v, Mapping) or (
            isinstance(v, (list, tuple)) and any(isinstance(x, (Mapping, list, tuple)) for x in v)
        )
        if not nested or len(flat) + ind <= 100 or not v:
            return flat
        pad, end = " " * (ind + 1), " " * ind
        if isinstance(v, Mapping):
            items = [
                f"{pad}{json.dumps(k, ensure_ascii=False)}: {enc(x, ind + 1)}" for k, x in v.items()
            ]
            return "{\n" + ",\n".join(items) + "\n" + end + "}"
        assert isinstance(v, (list, tuple))
        return "[\n" + ",\n".join(pad + enc(x, ind + 1) for x in v) + "\n" + end + "]"

    return enc(doc, 0) + "\n"


def renderer(ref: str) -> Render:
    """The function a result's ``bench`` field names (``bench.module:function``;
    only the bench package's own)."""
    module, _, attr = ref.partition(":")
    if not attr or not (module == "bench" or module.startswith("bench.")):
        raise ValueError(f"not a bench renderer: {ref!r}")
    fn = getattr(importlib.import_module(module), attr, None)
    if not callable(fn):
        raise ValueError(f"{ref!r} names no function")
    out: Render = fn
    return out


def render_body(doc: Mapping[str, Any]) -> str:
    """The body of a result file, from its JSON document."""
    if doc.get("format") != FORMAT:
        raise ValueError(f"result format {doc.get('format')!r}, this code reads {FORMAT}")
    return renderer(doc["bench"])(doc["params"], doc["data"])


def render_doc(doc: Mapping[str, Any]) -> str:
    """The whole ``.md`` of a result: title, where its data is, machine, body."""
    header = "\n".join(f"- {k}: {v}" for k, v in doc["machine"].items())
    return (
        f"# {doc['title']}\n\n"
        f"Rendered from `{doc['name']}.json` beside this file (the machine, the parameters "
        "and every round's data) by its bench's report; `python -m bench.report "
        f"{doc['name']}.json --check` renders it again and recomputes the verdicts.\n\n"
        f"## Machine\n\n{header}\n\n## Results\n\n{render_body(doc).rstrip()}\n"
    )


def show(bench: str, params: Mapping[str, Any], data: Mapping[str, Any]) -> str:
    """The body a run prints: rendered as from a recorded file (the data read
    back from its JSON text), so an unrecorded run goes the same way."""
    doc = json.loads(dumps({"params": params, "data": data}))
    return renderer(bench)(doc["params"], doc["data"])


def record(
    name: str,
    title: str,
    bench: str,
    params: Mapping[str, Any],
    data: Mapping[str, Any],
    *,
    results: Path | None = None,
    dated: bool = True,
) -> Path:
    """Write ``<stem>.json`` and ``<stem>.md`` (the stem ``<name>-<date>``, or
    ``name`` itself unless ``dated``) into :func:`results_dir`; the ``.md``'s path.

    ``bench`` names the function that renders the body from ``params`` and
    ``data`` (see the module doc); the ``.md`` is rendered from the JSON text
    as written, so rendering the file again gives the same text.
    """
    info = machine()
    stem = f"{name}-{info['date'][:10]}" if dated else name
    doc = {
        "format": FORMAT,
        "bench": bench,
        "name": stem,
        "title": title,
        "machine": info,
        "params": params,
        "data": data,
    }
    text = dumps(doc)
    md = render_doc(json.loads(text))
    out = results_dir(results)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{stem}.json").write_text(text)
    path = out / f"{stem}.md"
    path.write_text(md)
    return path
