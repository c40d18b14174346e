"""What the same-answer guarantees cost (issue 16, SPEC M19): llama-bench on two
builds and two settings of the pinned llama.cpp, in alternating rounds.

    python -m bench.numerics_bench --before LIB_DIR [--rounds 8] [--reps 5] [--no-record]

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
that does other things: within each round every test runs on both sides back
to back (which one goes first alternates), each side keeps the best of
``--reps`` repetitions, each round gives one ratio per test, and the
verdict is "met" only when every round clears the bar, "within noise" when the
bar lies inside the rounds' spread, "below bar" when no round does. Recorded
(``numerics-best-<date>.json`` beside the ``.md``) with every round's samples;
:func:`render` computes ratios and verdicts from them.
"""

from __future__ import annotations

import argparse
import json
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
REPS = 5  # llama-bench repetitions per side per round; the best one counts
DECODE_BAR = 0.97  # after / before, at least
UNTILED_BAR = 0.95  # untiled / tiled, at least, to be the default
RENDER = "bench.numerics_bench:render"
PARTS = ("decode", "prompt")


Samples = dict[str, list[float]]


def llama_bench(lib_dir: Path, args: Sequence[str], env: Mapping[str, str]) -> Samples:
    """One llama-bench run of ``lib_dir``'s binary on its own libraries: every
    repetition's tok/s per test."""
    exe = lib_dir / "llama-bench"
    if not exe.is_file():
        sys.exit(f"{exe} missing: run `python scripts/native.py llama --tools` (make bench does)")
    cmd = [str(exe), "-m", str(paths.default_model_path()), *args]
    cmd += ["-t", str(THREADS), "-fa", "1", "-o", "json"]
    run_env = {**os.environ, **env, "LD_LIBRARY_PATH": str(lib_dir)}
    out = subprocess.run(cmd, env=run_env, capture_output=True, text=True, check=True).stdout
    found: Samples = {}
    for row in json.loads(out):
        decode = int(row["n_gen"]) > 0
        test = f"tg{row['n_gen']}@{row['n_depth']}" if decode else f"pp{row['n_prompt']}"
        found[test] = [float(x) for x in row["samples_ts"]]
    return found


def best(value: float | Sequence[float]) -> float:
    """A side's figure in one round: the best of its repetitions (what the
    code can do when nothing else got in the way), or the single figure an
    older record kept."""
    return max(value) if isinstance(value, Sequence) else float(value)


def measure(
    before: Path, after: Path, rounds: int, reps: int, parts: Sequence[str] = PARTS
) -> dict[str, Any]:
    """Per round, per test, the two sides back to back (which goes first
    alternates): a burst of other work on the machine then lands on one
    round's pair rather than on one side of every comparison."""
    sides: dict[str, tuple[Path, dict[str, str]]] = {
        "before": (before, {}),
        "after": (after, {}),
        "tiled": (after, {TILED_ENV: "1"}),
        "untiled": (after, {TILED_ENV: "0"}),
    }
    tests: list[tuple[tuple[str, str], list[str]]] = []
    if "decode" in parts:
        tests += [
            (("before", "after"), ["-p", "0", "-n", str(DECODE_TOKENS), "-d", str(d)])
            for d in DEPTHS
        ]
    if "prompt" in parts:
        tests += [(("tiled", "untiled"), ["-p", str(n), "-n", "0"]) for n in PROMPTS]
    data: dict[str, Any] = {name: [] for name in sides}
    for r in range(rounds):
        got: dict[str, Samples] = {name: {} for name in sides}
        for pair, args in tests:
            for name in pair if r % 2 == 0 else pair[::-1]:
                lib, env = sides[name]
                got[name].update(llama_bench(lib, [*args, "-r", str(reps)], env))
        for name in sides:
            data[name].append(got[name])
        print(f"round {r + 1}/{rounds}: {got}", flush=True)
    return data


def _rows(data: Mapping[str, Any], a: str, b: str, bar: float) -> list[list[object]]:
    rows: list[list[object]] = []
    for test in data[a][0]:
        xs = [best(rnd[test]) for rnd in data[a]]
        ys = [best(rnd[test]) for rnd in data[b]]
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
    lines = [
        f"{params['rounds']} alternating rounds, {params['threads']} threads, flash attention "
        f"on, the default model. Before: `{params['before']}` (patches "
        f"{params['before_patches']}); after: `{params['after']}` (patches "
        f"{params['after_patches']}). {_method(params)}Tok/s: median of the rounds; ratio: "
        "median of the per-round ratios; spread: their range. Verdict: met only if every "
        "round clears the bar, within noise if the bar lies inside the spread.",
        "",
    ]
    if data["before"] and data["before"][0]:
        decode = table(
            ["test", "before tok/s", "after tok/s", *columns],
            _rows(data, "before", "after", DECODE_BAR),
        )
        lines += [
            "## Decode at KV depth: grouped flash attention (patch 0003) against the split "
            "it replaces",
            "",
            "`tgN@D`: N tokens decoded after a D-token prompt.",
            "",
            decode,
            "",
        ]
    if data["tiled"] and data["tiled"][0]:
        prompt = table(
            ["test", "tiled tok/s", "untiled tok/s", *columns],
            _rows(data, "tiled", "untiled", UNTILED_BAR),
        )
        lines += [
            "## Prompt processing: the tiled path off (`GGML_CPU_FA_TILED=0`, the "
            "`deterministic` option) against on",
            "",
            prompt,
            "",
        ]
    return "\n".join(lines)


def _method(params: Mapping[str, Any]) -> str:
    """How a round's figure was taken (a record from before ``reps`` took one run)."""
    if "reps" not in params:
        return ""
    return (
        f"Each round runs every test on both sides back to back and keeps each side's best of "
        f"{params['reps']} repetitions. "
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
    ap.add_argument("--reps", type=int, default=REPS, help="repetitions per side per round")
    ap.add_argument(
        "--only", choices=PARTS, help="measure one part (decode or prompt) instead of both"
    )
    ap.add_argument("--no-record", action="store_true")
    args = ap.parse_args()
    if args.rounds < MIN_ROUNDS and not args.no_record:
        ap.error(f"a recorded result needs --rounds >= {MIN_ROUNDS} (or pass --no-record)")
    after = Path(build_record()["lib_dir"])
    before = args.before.expanduser().resolve()
    params = {
        "rounds": args.rounds,
        "reps": args.reps,
        "parts": [args.only] if args.only else list(PARTS),
        "threads": THREADS,
        "before": str(before),
        "after": str(after),
        "before_patches": _patches(before),
        "after_patches": _patches(after),
        "depths": list(DEPTHS),
        "prompts": list(PROMPTS),
    }
    data = measure(before, after, args.rounds, args.reps, params["parts"])
    if args.no_record:
        print(show(RENDER, params, data))
    else:
        title = "Same answer under any load: what grouped flash attention and the untiled path cost"
        print(f"recorded {record('numerics-best', title, RENDER, params, data)}")


if __name__ == "__main__":
    main()
