"""The daemon on a GPU: warm TTFT through the client (issue 21, item 5).

    python -m bench.gpu_daemon MODEL.gguf MACHINE.txt [--sizes 2048 16384] [--rounds 5]
                               [--results DIR] [--commit SHA]

``bench/gpu/daemon_run.sh`` runs this on a lent GPU machine, after building
the pinned, patched libllama with CUDA through ``scripts/native.py`` and the
binding through ``build_ffi.py``, exactly as ``make setup`` does with
``LLAMA_BACKEND=cuda``. Where ``bench.gpu_restore`` measures the restore at
the library level, this runs the real daemon (root, front, cache-meta, the
gateway and one model worker, every layer on the GPU) and measures what a
client sees.

Per row size and round, back to back, the way ``bench.peers`` measures P1
and P12 on the CPU:

- **cold**: a fresh prompt (a nonce first), one token;
- **repeat**: the same prompt the moment the reply ended (its idle entry is
  still in the KV: P12's live hit);
- **ram**: ``n_seq_max`` short fillers take every sequence, the prompt's idle
  entry last, then the prompt again: restored from the cache (the tier the
  cache chose, reported from ``cache_delta.sources``). None of these waits
  for a save.

Then the daemon restarts (SIGTERM, a new tree over the same state) and each
size's prompt is sent once more (**restart**: P2's disk restore). Each
warm reply (8 greedy tokens) is compared with its cold reply: on the GPU the
README promises no bit-exactness across a restore, so the report says what
held rather than asserting it.

The floors are measured with torch, which the device machine carries: one
``cudaMemcpy`` of the largest row's bytes from pinned and from pageable host
memory (best of five). The model is the random-weight stand-in of the default
model's shape (``bench/gpu/synth_model.py``), with the real vocabulary.

Choices stated: the daemon runs with ``n_seq_max`` 2 and a context holding
the largest size plus fillers; tiers, quotas and policy are the defaults.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from bench.common import record, table

NAME = "m"
N_SEQ_MAX = 2
FILLER_TOKENS = 32
REPLY_TOKENS = 8


def _words(nonce: str, n: int) -> str:
    return " ".join(f"{nonce}w{i % 97}" for i in range(n))


def exact_tokens(client: Any, nonce: str, n: int) -> list[int]:
    """Exactly ``n`` token ids, the nonce first (no two prompts share a row)."""
    text = _words(nonce, n)
    ids: list[int] = client.tokenize(NAME, text)
    while len(ids) < n:
        text += " " + _words(nonce + "+", n)
        ids = client.tokenize(NAME, text)
    return ids[:n]


def first_token(client: Any, ids: list[int]) -> dict[str, Any]:
    """One greedy request: client-side TTFT, the reply's tokens, the worker's
    stats and where the prompt's tokens came from."""
    from llamad.model.results import DoneEvent, TokenEvent  # noqa: PLC0415

    first: float | None = None
    tokens: list[int] = []
    result = None
    started = time.perf_counter()
    for event in client.infer(NAME, ids, max_tokens=REPLY_TOKENS, temperature=0.0):
        if isinstance(event, TokenEvent) and event.token is not None:
            if first is None:
                first = time.perf_counter() - started
            tokens.append(int(event.token))
        elif isinstance(event, DoneEvent):
            result = event.result
    assert result is not None
    s = result.stats
    return {
        "ttft_ms": (first if first is not None else time.perf_counter() - started) * 1e3,
        "reply": tokens,
        "sources": result.cache_delta.sources.as_dict(),
        "queue_ms": s.queue_ms,
        "restore_ms": s.restore_ms,
        "lookup_ms": s.lookup_ms,
        "load_ms": s.load_ms,
        "prefill_ms": s.prefill_ms,
        "prefill_tokens": s.prefill_tokens,
    }


def floors(nbytes: int) -> dict[str, float]:
    """Best of five host-to-device copies of ``nbytes``, pinned and pageable (ms)."""
    try:
        import torch  # type: ignore[import-not-found]  # noqa: PLC0415
    except ImportError:
        return {}
    out: dict[str, float] = {}
    dev = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    for kind, pinned in (("pinned", True), ("pageable", False)):
        host = torch.ones(nbytes, dtype=torch.uint8, pin_memory=pinned)
        best = float("inf")
        for _ in range(5):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            dev.copy_(host)
            torch.cuda.synchronize()
            best = min(best, time.perf_counter() - t0)
        out[kind] = best * 1e3
    return out


def run(model: Path, sizes: Sequence[int], rounds: int) -> dict[str, Any]:
    from bench.peers.llamad_sys import LlamadDaemon, ModelTable  # noqa: PLC0415

    n_ctx = max(sizes) * N_SEQ_MAX + 1024
    daemon = LlamadDaemon("gpu", [ModelTable(NAME, n_ctx, N_SEQ_MAX, threads=4)], threads=4)
    # The model: the stand-in, not the default GGUF this machine does not have.
    daemon.launcher.env["LLAMAD_DEFAULT_MODEL"] = str(model)
    lines: list[dict[str, Any]] = []
    prompts: dict[int, list[int]] = {}
    started = time.perf_counter()
    client = daemon.start()
    start_s = time.perf_counter() - started
    try:
        for rnd in range(rounds):
            for n in sizes:
                ids = exact_tokens(client, f"r{rnd}n{n}x{uuid.uuid4().hex[:6]}", n)
                prompts[n] = ids
                cold = first_token(client, ids)
                lines.append({"round": rnd, "tokens": n, "what": "cold", **cold})
                rep = first_token(client, ids)
                lines.append({"round": rnd, "tokens": n, "what": "repeat", **rep})
                for i in range(N_SEQ_MAX):
                    first_token(client, exact_tokens(client, f"f{rnd}-{n}-{i}", FILLER_TOKENS))
                warm = first_token(client, ids)
                lines.append({"round": rnd, "tokens": n, "what": "ram", **warm})
        code = daemon.stop()
        client = daemon.start()
        for n, ids in prompts.items():
            again = first_token(client, ids)
            lines.append({"round": rounds, "tokens": n, "what": "restart", "exit": code, **again})
        row = daemon.largest_ram_row()
        # Every copy in the memory tiers evicted: the next hit reads the row
        # from disk by copy, into the worker's read buffer (pinned memory
        # from the GPU's host buffer type when the model is offloaded).
        for n, ids in prompts.items():
            for i in range(N_SEQ_MAX):  # the prompts' idle entries out of the KV
                first_token(client, exact_tokens(client, f"g{n}-{i}", FILLER_TOKENS))
            client.evict_bytes(sys.maxsize, ["ram", "ram_file"])
            disk = first_token(client, ids)
            lines.append({"round": rounds, "tokens": n, "what": "disk", **disk})
    finally:
        daemon.remove()
    for line in lines:
        if line["what"] != "cold":
            ref = [c for c in lines if c["what"] == "cold" and c["tokens"] == line["tokens"]]
            same = [c for c in ref if c["round"] == line["round"]] or ref[-1:]
            line["same_reply"] = bool(same) and line["reply"] == same[0]["reply"]
    return {"lines": lines, "start_s": start_s, "largest_ram_row": row, "floors": floors(row)}


def report(params: Mapping[str, Any], data: Mapping[str, Any]) -> str:
    lines: list[dict[str, Any]] = data["lines"]
    out = [
        f"GPU: {params['gpu']}; CUDA {params['cuda']}; llama.cpp {params['llama_cpp']}; "
        f"model: {params['model']}; the real daemon (every layer on the GPU), "
        f"`n_seq_max` {N_SEQ_MAX}, default tiers; {params['rounds']} rounds; TTFT observed by "
        f"the client; median (min-max). Daemon start to ready: {data['start_s']:.1f} s.",
        "",
    ]
    fl = data.get("floors") or {}
    row = data.get("largest_ram_row", 0)
    if fl:
        out.append(
            f"Floors for the largest row in the `ram` tier ({row / 1e6:.1f} MB): one host-to-"
            f"device copy from pinned memory {fl['pinned']:.3f} ms, from pageable memory "
            f"{fl['pageable']:.3f} ms (torch, best of five)."
        )
        out.append("")
    rows = []
    all_same = True
    for n in params["sizes"]:
        for what in ("cold", "repeat", "ram", "restart", "disk"):
            got = [x for x in lines if x["tokens"] == n and x["what"] == what]
            if not got:
                continue
            ttft = [x["ttft_ms"] for x in got]
            restore = [x["restore_ms"] for x in got]
            lookup = [x.get("lookup_ms", 0.0) for x in got]
            load = [x.get("load_ms", 0.0) for x in got]
            srcs: dict[str, int] = {}
            for x in got:
                for k, v in x["sources"].items():
                    if v:
                        srcs[k] = srcs.get(k, 0) + v
            src = ", ".join(f"{k} {v // len(got)}" for k, v in sorted(srcs.items())) or "-"
            same = "-" if what == "cold" else f"{sum(x['same_reply'] for x in got)}/{len(got)}"
            if what != "cold":
                all_same = all_same and all(x["same_reply"] for x in got)
            rows.append(
                [
                    f"{n:,}",
                    what,
                    f"{statistics.median(ttft):.2f} ({min(ttft):.2f}-{max(ttft):.2f})",
                    f"{statistics.median(restore):.2f}",
                    f"{statistics.median(lookup):.2f}",
                    f"{statistics.median(load):.2f}",
                    src,
                    same,
                ]
            )
    out.append(
        table(
            [
                "tokens",
                "request",
                "TTFT ms",
                "restore ms",
                "of it lookup",
                "of it load",
                "prompt from (mean)",
                "same reply",
            ],
            rows,
        )
    )
    out.append("")
    out.append(
        "**Verdict (warm TTFT of the daemon on the GPU): recorded; "
        + (
            "every warm reply equal to its cold reply.**"
            if all_same
            else "some warm replies differ from their cold reply (see the table).**"
        )
    )
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model", type=Path)
    ap.add_argument("machine_txt", type=Path, help="nvidia-smi and nvcc lines")
    ap.add_argument("--sizes", type=int, nargs="+", default=[2048, 16384])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--results", type=Path, default=None)
    ap.add_argument("--commit", default="unknown")
    args = ap.parse_args(argv)
    txt = args.machine_txt.read_text().splitlines()
    params = {
        "gpu": txt[1].strip() if len(txt) > 1 else "unknown",
        "cuda": next((x.strip() for x in txt if "release" in x), "unknown"),
        "llama_cpp": "pinned source with llamad's patches, built by scripts/native.py "
        "(LLAMA_BACKEND=cuda)",
        "model": "random-weight stand-in of SmolLM2-135M's shape, f16 (bench/gpu/synth_model.py)",
        "sizes": list(args.sizes),
        "rounds": args.rounds,
        "commit": args.commit,
    }
    data = run(args.model, args.sizes, args.rounds)
    path = record(
        "gpu-daemon",
        "The daemon on a GPU: warm TTFT through the client",
        "bench.gpu_daemon:report",
        params,
        data,
        results=args.results,
    )
    print(path.read_text())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
