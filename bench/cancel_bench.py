"""Cancel mid-prefill and the abort check's cost (issue 21 item 3).

    python -m bench.cancel_bench [--rounds 3] [--hogs 2] [--only steps|cancel] [--no-record]

**Steps** (in-process, the binding, the default model, a context of the
worker's shape: ``n_batch``/``n_ubatch`` 512, every core): decode steps with
the abort check uninstalled against installed with its probe (every 3 ms, as
the worker's: a zero-timeout ``zmq_poll`` of an idle ROUTER socket, which is
what the worker's probe does when nothing is pending), in alternating rounds:
one-row steps over a 256-token sequence, and 128-row prefill chunks.

**Cancel** (a real daemon, the default configuration but ``n_seq_max`` 2:
``n_batch`` 2048, ``n_ubatch`` 512, prefill chunks of 512): a 1,500-token
prompt (a nonce first, so it is cold), greedy, ``max_tokens`` 1; once the
worker's status board shows it prefilling, a random 50-400 ms more (so the
cancel lands anywhere in a chunk), then ``Client.cancel`` from a second
connection. Measured: from the cancel call to the ``done`` event at the
stream (``cancelled``), and the prompt tokens the request had committed
(``prefill_tokens``). With ``--hogs N``, N busy-loop processes run the whole
time (``bench.hogs``: killed in ``finally``, and each ends on its own once
this process is gone).

Run it against another tree for the "before" figures: ``PYTHONPATH=<tree>/src
python -m bench.cancel_bench --only cancel`` (the daemon runs that tree's
code). Records ``bench/results/cancel-<date>.{json,md}`` (``--tag`` is
appended to the name).
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from bench.common import median, record, show, table
from bench.hogs import Hogs

RENDER = "bench.cancel_bench:render"
BAR_MS = 50.0  # issue 21: a cancel mid-prefill ends the request within this, in every trial
MODEL = "m"
PROMPT_TOKENS = 1500


def loadavg() -> float:
    return round(os.getloadavg()[0], 2)


# -- steps ------------------------------------------------------------------------------


def steps(rounds: int) -> dict[str, Any]:
    import zmq  # noqa: PLC0415

    from llamad import paths  # noqa: PLC0415
    from llamad.llama_ffi import Batch, ContextOptions, Model  # noqa: PLC0415
    from llamad.llama_ffi.native import ffi, lib  # noqa: PLC0415

    cores = len(os.sched_getaffinity(0))
    model = Model(paths.default_model_path())
    ctx = model.context(
        ContextOptions(
            n_ctx=2048,
            n_batch=512,
            n_ubatch=512,
            n_seq_max=2,
            kv_unified=True,
            n_threads=cores,
            n_threads_batch=cores,
        )
    )
    zctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    sock = zctx.socket(zmq.ROUTER)
    sock.bind(f"ipc:///tmp/lcb-{uuid.uuid4().hex[:8]}.sock")
    items = [(sock, zmq.POLLIN)]

    def probe() -> bool:
        return bool(zmq.zmq_poll(items, 0))

    prompt = model.tokenize("The sea is wide and deep, and the wind is cold. " * 40)[:256]
    ctx.prefill(prompt[:-1])
    batch = Batch(512)
    chunk = model.tokenize("A river runs to the sea under the hills. " * 40)[:128]

    def one_row() -> float:
        batch.clear()
        batch.add_tokens([prompt[-1]], 0, len(prompt) - 1, logits_last=True)
        t = time.perf_counter()
        ctx.decode(batch)
        took = time.perf_counter() - t
        ctx.seq_remove(0, len(prompt) - 1)
        return took

    def prefill() -> float:
        batch.clear()
        batch.add_tokens(chunk, 1, 0, logits_last=False)
        t = time.perf_counter()
        ctx.decode(batch)
        took = time.perf_counter() - t
        ctx.seq_remove(1, 0)
        return took

    def variant(on: bool) -> None:
        ptr = ctx._ptr()
        if on:
            lib.llamad_abort_install(ptr, ctx._abort)
            ctx.set_abort_probe(probe, 0.003)
        else:
            lib.llamad_abort_install(ptr, ffi.NULL)
            ctx.set_abort_probe(None)

    rows: list[dict[str, Any]] = []
    try:
        for r in range(rounds + 1):
            for on in (False, True) if r % 2 == 0 else (True, False):
                variant(on)
                ones = [one_row() for _ in range(40)]
                fills = [prefill() for _ in range(3)]
                if r == 0:
                    continue  # warm-up
                rows.append(
                    {
                        "round": r,
                        "check": on,
                        "one_row_ms": round(median(ones) * 1000, 3),
                        "prefill128_ms": round(median(fills) * 1000, 2),
                        "probes": ctx.abort_stats[1],
                        "load": loadavg(),
                    }
                )
    finally:
        batch.close()
        ctx.close()
        model.close()
        sock.close(0)
        zctx.term()
    return {"threads": cores, "rows": rows}


# -- cancel -----------------------------------------------------------------------------


def cancel(trials: int) -> dict[str, Any]:
    from llamad import Client  # noqa: PLC0415
    from llamad.model.status_board import read_status, status_path  # noqa: PLC0415
    from llamad.testing import Launcher  # noqa: PLC0415

    launcher = Launcher(prefix="lcb-", instance=f"cb{uuid.uuid4().hex[:10]}")
    launcher.write_config(
        f"""
[daemon]
runtime_dir = "{launcher.runtime}"
state_dir = "{launcher.state}"
log_format = "json"
log_level = "warning"
[cache]
instance = "{launcher.instance}"
[models.{MODEL}]
path = "default"
n_seq_max = 2
"""
    )
    out: list[dict[str, Any]] = []
    try:
        launcher.start()
        launcher.wait_routed([MODEL], timeout=180.0)
        board = status_path(launcher.registry_root, f"model.{MODEL}")
        with (
            Client(launcher.endpoint, timeout=300.0) as client,
            Client(launcher.endpoint, timeout=60.0) as canceller,
        ):
            client.complete(MODEL, "Hello", max_tokens=1, temperature=0.0)
            # The canceller's connection to the worker is made now: a handshake
            # sent during a decode waits for it where nothing reads the socket
            # inside a decode (the code before issue 21).
            canceller.cancel("none", model_id=MODEL)
            words = " ".join(f"word{i % 97} sea{i % 13}" for i in range(PROMPT_TOKENS))
            for i in range(trials):
                nonce = uuid.uuid4().hex
                tokens = client.tokenize(MODEL, f"{nonce} {words}")[:PROMPT_TOKENS]
                rid = f"c{i}-{nonce[:6]}"
                stream = client.infer(MODEL, tokens, request_id=rid, max_tokens=1, temperature=0.0)

                def prefilling() -> bool:
                    snap = read_status(board)
                    return (
                        snap is not None
                        and snap.busy_since is not None
                        and snap.status.phase == "prefilling"
                    )

                _wait(prefilling, 120.0)
                time.sleep(random.uniform(0.05, 0.4))
                t0 = time.perf_counter()
                canceller.cancel(rid, model_id=MODEL)
                done = stream.completion()
                latency = time.perf_counter() - t0
                out.append(
                    {
                        "trial": i,
                        "latency_ms": round(latency * 1000, 1),
                        "finish": str(done.finish_reason),
                        "prefill_tokens": done.stats.prefill_tokens,
                        "load": loadavg(),
                    }
                )
    finally:
        launcher.close(120.0)
    return {"prompt_tokens": PROMPT_TOKENS, "trials": out}


def _wait(predicate: Callable[[], bool], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError("the worker never showed the prompt prefilling")
        time.sleep(0.005)


# -- report -----------------------------------------------------------------------------


def render(params: Mapping[str, Any], data: Mapping[str, Any]) -> str:
    parts = [
        f"Hogs: {params['hogs']}; code under test: `{params['tree']}`; "
        f"load at start {params['load_start']}, at end {data.get('load_end')}.",
        "",
    ]
    st = data.get("steps")
    if st:
        parts += [f"**Decode steps** ({st['threads']} threads), medians per round:", ""]
        parts.append(
            table(
                ["round", "abort check", "one row ms", "128-row chunk ms", "load"],
                [
                    [
                        r["round"],
                        "on" if r["check"] else "off",
                        r["one_row_ms"],
                        r["prefill128_ms"],
                        r["load"],
                    ]
                    for r in st["rows"]
                ],
            )
        )
        for key in ("one_row_ms", "prefill128_ms"):
            on = [r[key] for r in st["rows"] if r["check"]]
            off = [r[key] for r in st["rows"] if not r["check"]]
            if on and off:
                parts.append(
                    f"\n{key}: on/off = {statistics.median(on) / statistics.median(off):.3f}"
                )
        parts.append("")
    ca = data.get("cancel")
    if ca:
        lat = [t["latency_ms"] for t in ca["trials"]]
        parts += [
            f"**Cancel mid-prefill** ({ca['prompt_tokens']}-token prompt): "
            f"median {statistics.median(lat):.1f} ms, max {max(lat):.1f} ms; "
            f"bar <= {BAR_MS:g} ms in every trial: {cancel_verdict(ca['trials'])}",
            "",
            table(
                ["trial", "cancel to done ms", "finish", "prefill tokens", "load"],
                [
                    [t["trial"], t["latency_ms"], t["finish"], t["prefill_tokens"], t["load"]]
                    for t in ca["trials"]
                ],
            ),
        ]
    return "\n".join(parts) + "\n"


def cancel_verdict(trials: Sequence[Mapping[str, Any]]) -> str:
    """``met`` when every trial ended ``cancelled`` within :data:`BAR_MS`; a
    trial that finished otherwise measured no cancel, and fails the run."""
    if not trials:
        return "no trials"
    if any(t["finish"] != "cancelled" for t in trials):
        return "NOT A CANCEL (a trial finished otherwise)"
    return "met" if max(t["latency_ms"] for t in trials) <= BAR_MS else "ABOVE BAR"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--trials", type=int, default=8)
    parser.add_argument("--hogs", type=int, default=0)
    parser.add_argument("--only", choices=("steps", "cancel"))
    parser.add_argument("--tag", default="")
    parser.add_argument("--no-record", action="store_true")
    args = parser.parse_args()
    import llamad  # noqa: PLC0415

    params = {
        "rounds": args.rounds,
        "trials": args.trials,
        "hogs": args.hogs,
        "tree": os.path.dirname(os.path.dirname(os.path.dirname(llamad.__file__))),
        "load_start": loadavg(),
    }
    data: dict[str, Any] = {}
    with Hogs(args.hogs):
        if args.only in (None, "steps"):
            data["steps"] = steps(args.rounds)
        if args.only in (None, "cancel"):
            data["cancel"] = cancel(args.trials)
    data["load_end"] = loadavg()
    if args.no_record:
        print(show(RENDER, params, data))
    else:
        name = "cancel" + (f"-{args.tag}" if args.tag else "")
        path = record(name, "Cancel mid-prefill (issue 21 item 3)", RENDER, params, data)
        print(path.read_text())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
