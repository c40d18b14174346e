"""What the same-answer guarantees cost (issue 16, SPEC M19): llama-bench on two
builds and two settings of the pinned llama.cpp, in alternating rounds.

    python -m bench.numerics_bench --before LIB_DIR [--rounds 8] [--no-record]

* **Decode, grouped flash attention** (patch 0003): decode tok/s at KV depths
  512, 1,024, 2,048 and 4,096 (``llama-bench -p 0 -n 64 -d D``, 2 threads,
  flash attention on), ``--before`` (a build folder of the previous patch set,
  whose ``llama-bench`` and libraries are used) against this checkout's build.
  Bar: after / before >= 0.97 at every depth.
* **Prompt processing without the tiled path** (``GGML_CPU_FA_TILED=0``, what
  the ``deterministic`` model option sets): prefill tok/s at 512 and 2,048
  tokens on this checkout's build, tiled against untiled (the same binary).
  The cost decides whether the setting is the default: untiled / tiled >=
  0.95 would make it so (SPEC M19: what costs more than 5 % goes behind the
  option). Decode steps of fewer than 64 rows (P3's 4 streams and P4's one)
  never take the tiled path, so they cost nothing either way.

Both run on the default thread count (2 on the reference machine) on a machine
that does other things: the two sides alternate within each round (which one
goes first alternates too), each round gives one ratio per test, and the
verdict is "met" only when every round clears the bar, "within noise" when the
bar lies inside the rounds' spread, "below bar" when no round does. Recorded
(``numerics-<date>.json`` beside the ``.md``) with every round's samples;
:func:`render` computes ratios and verdicts from them.
"""

from __future__ import annotations

import argparse
import csv
import io
import os
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from bench.common import median, record, show, table
from bench.ffi_bench import verdict
from llamad import paths
from llamad.llama_ffi import default_threads
from llamad.llama_ffi.build_info import build_record
from llamad.model.worker_spec import TILED_ENV

DEPTHS = (512, 1024, 2048, 4096)
DECODE_TOKENS = 64
PROMPTS = (512, 2048)
THREADS = default_threads()
MIN_ROUNDS = 5
DECODE_BAR = 0.97  # after / before, at least
UNTILED_BAR = 0.95  # untiled / tiled, at least, to be the default
RENDER = "bench.numerics_bench:render"


def llama_bench(lib_dir: Path, args: Sequence[str], env: Mapping[str, str]) -> dict[str, float]:
    """One llama-bench run of ``lib_dir``'s binary on its own libraries: tok/s per test."""
    exe = lib_dir / "llama-bench"
    if not exe.is_file():
        sys.exit(f"{exe} missing: run `python scripts/native.py llama --tools` (make bench does)")
    cmd = [str(exe), "-m", str(paths.default_model_path()), *args]
    cmd += ["-t", str(THREADS), "-fa", "1", "-r", "1", "-o", "csv"]
    run_env = {**os.environ, **env, "LD_LIBRARY_PATH": str(lib_dir)}
    out = subprocess.run(cmd, env=run_env, capture_output=True, text=True, check=True).stdout
    found: dict[str, float] = {}
    for row in csv.DictReader(io.StringIO(out)):
        if int(row["n_gen"]):
            found[f"tg{row['n_gen']}@{row['n_depth']}"] = float(row["avg_ts"])
        else:
            found[f"pp{row['n_prompt']}"] = float(row["avg_ts"])
    return found


def measure(before: Path, after: Path, rounds: int) -> dict[str, Any]:
    decode_args = ["-p", "0", "-n", str(DECODE_TOKENS), "-d", ",".join(map(str, DEPTHS))]
    prompt_args = ["-p", ",".join(map(str, PROMPTS)), "-n", "0"]
    sides: dict[str, tuple[Path, Sequence[str], dict[str, str]]] = {
        "before": (before, decode_args, {}),
        "after": (after, decode_args, {}),
        "tiled": (after, prompt_args, {TILED_ENV: "1"}),
        "untiled": (after, prompt_args, {TILED_ENV: "0"}),
    }
    data: dict[str, Any] = {name: [] for name in sides}
    for r in range(rounds):
        for pair in (("before", "after"), ("tiled", "untiled")):
            for name in pair if r % 2 == 0 else pair[::-1]:
                lib, args, env = sides[name]
                data[name].append(llama_bench(lib, args, env))
                print(f"round {r + 1}/{rounds} {name}: {data[name][-1]}", flush=True)
    return data


def _rows(data: Mapping[str, Any], a: str, b: str, bar: float) -> list[list[object]]:
    rows: list[list[object]] = []
    for test in data[a][0]:
        xs = [rnd[test] for rnd in data[a]]
        ys = [rnd[test] for rnd in data[b]]
        ratios = [y / x for x, y in zip(xs, ys, strict=True)]
        rows.append(
            [
                test,
                f"{median(xs):.1f}",
                f"{median(ys):.1f}",
                f"{median(ratios):.3f}",
                f"{min(ratios):.3f}-{max(ratios):.3f}",
                f">= {bar:g}",
                verdict(ratios, bar, at_least=True),
            ]
        )
    return rows


def render(params: Mapping[str, Any], data: Mapping[str, Any]) -> str:
    columns = ["ratio (median)", "spread", "bar", "verdict"]
    decode = table(
        ["test", "before tok/s", "after tok/s", *columns],
        _rows(data, "before", "after", DECODE_BAR),
    )
    prompt = table(
        ["test", "tiled tok/s", "untiled tok/s", *columns],
        _rows(data, "tiled", "untiled", UNTILED_BAR),
    )
    return "\n".join(
        [
            f"{params['rounds']} alternating rounds, {params['threads']} threads, flash attention "
            f"on, the default model. Before: `{params['before']}` (patches "
            f"{params['before_patches']}); after: `{params['after']}` (patches "
            f"{params['after_patches']}). Tok/s: median of the rounds; ratio: median of the "
            "per-round ratios; spread: their range. Verdict: met only if every round clears "
            "the bar, within noise if the bar lies inside the spread.",
            "",
            "## Decode at KV depth: grouped flash attention (patch 0003) against the split "
            "it replaces",
            "",
            "`tgN@D`: N tokens decoded after a D-token prompt.",
            "",
            decode,
            "",
            "## Prompt processing: the tiled path off (`GGML_CPU_FA_TILED=0`, the "
            "`deterministic` option) against on",
            "",
            prompt,
            "",
        ]
    )


def _patches(lib_dir: Path) -> str:
    """The patch digest a build folder was made with (its folder name says it)."""
    name = lib_dir.parent.parent.name  # <cache>/<version>-<pin>-p<digest>-<backend>/build/bin
    parts = [p for p in name.split("-") if p.startswith("p") and len(p) == 9]
    return parts[0][1:] if parts else "none"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--before", type=Path, required=True, help="lib dir of the build to compare")
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--no-record", action="store_true")
    args = ap.parse_args()
    if args.rounds < MIN_ROUNDS and not args.no_record:
        ap.error(f"a recorded result needs --rounds >= {MIN_ROUNDS} (or pass --no-record)")
    after = Path(build_record()["lib_dir"])
    before = args.before.expanduser().resolve()
    params = {
        "rounds": args.rounds,
        "threads": THREADS,
        "before": str(before),
        "after": str(after),
        "before_patches": _patches(before),
        "after_patches": _patches(after),
        "depths": list(DEPTHS),
        "prompts": list(PROMPTS),
    }
    data = measure(before, after, args.rounds)
    if args.no_record:
        print(show(RENDER, params, data))
    else:
        title = "Same answer under any load: what grouped flash attention and the untiled path cost"
        print(f"recorded {record('numerics', title, RENDER, params, data)}")


if __name__ == "__main__":
    main()
