"""What releasing saved idle entries buys the decode beside them (issue 21).

    python -m bench.idle_release_probe [--threads 1] [--rounds 4] [--tokens 150] [--shared]

Model workers of the default model with cache-meta under a supervisor
(``n_ctx`` 4096, 6 sequences, unified KV, ``--threads`` each), alike but for
``release_saved_idle``: ``keep`` (off, the old behaviour) and ``release``
(on), in alternating order by round. Each round, on each: a 2,048-token
prompt is served (one token) and waited for until the worker lists its idle
entry as saved; then one greedy stream of ``--tokens`` tokens, then four at
once (fresh short prompts each round, never saved: shorter than
``min_tokens``). On ``keep`` the 2,048-token entry stays in the KV beside the
streams; on ``release`` the streams' start clears it.

By default every round and variant gets a fresh tree (the prompt is cold,
the KV otherwise empty: a daemon that has served the one long prompt).
``--shared`` keeps both workers through every round: the prompt is a live
hit on ``keep`` and a ``ram`` restore on ``release``, and the earlier
rounds' stream entries (unsaved) stay in the KV on both, wherever their
cells landed.

Not a recorded bench (no result file): it prints tokens per second for each
case, median and range over rounds, the ratio release / keep, and the load.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import threading
import time
from collections.abc import Iterator

from bench.worker_bench import prompt_text
from bench.worker_bench_report import steady_rate

N_CTX = 4096
N_SEQ = 6
PROMPT_TOKENS = 2048
VARIANTS = ("keep", "release")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--tokens", type=int, default=150)
    ap.add_argument(
        "--shared",
        dest="fresh",
        action="store_false",
        help="both workers live through every round (earlier rounds' entries stay); "
        "default: a fresh tree per round and variant",
    )
    args = ap.parse_args()

    from llamad import paths  # noqa: PLC0415
    from llamad.actors import Registry  # noqa: PLC0415
    from llamad.cache.sup import meta_child_spec  # noqa: PLC0415
    from llamad.llama_ffi import ContextOptions  # noqa: PLC0415
    from llamad.model.config import WorkerConfig  # noqa: PLC0415
    from llamad.model.results import TokenEvent  # noqa: PLC0415
    from llamad.model.worker_client import WorkerClient  # noqa: PLC0415
    from llamad.model.worker_spec import WorkerSpec, worker_child_spec  # noqa: PLC0415
    from llamad.supervisor import Supervisor, SupervisorSpec, SupFlags  # noqa: PLC0415
    from llamad.testing import discard_scratch, scratch_settings  # noqa: PLC0415

    n = args.threads
    context = ContextOptions(
        n_ctx=N_CTX,
        n_batch=512,
        n_seq_max=N_SEQ,
        n_ubatch=512,
        kv_unified=True,
        n_threads=n,
        n_threads_batch=n,
    )

    @contextlib.contextmanager
    def tree(names: tuple[str, ...]) -> Iterator[Registry]:
        """cache-meta and the workers ``names`` (each a variant) under one supervisor."""
        settings = scratch_settings(prefix="lirp", ram_quota=1 << 30, disk_quota=1 << 30)
        specs = [
            WorkerSpec(
                model_id=name,
                model_path=str(paths.default_model_path()),
                context=context,
                worker=WorkerConfig(
                    n_ctx=N_CTX, n_batch=512, n_seq_max=N_SEQ, release_saved_idle=name == "release"
                ),
                cache=settings,
            )
            for name in names
        ]
        assert settings.registry_root is not None
        children = (meta_child_spec(settings), *(worker_child_spec(s) for s in specs))
        sup = Supervisor(
            SupervisorSpec("idle_release_probe", SupFlags(intensity=1, period=60), children)
        )
        try:
            sup.start()
            yield Registry(settings.registry_root)
        finally:
            try:
                sup.stop(120)
            finally:
                discard_scratch(settings)

    def client(registry: Registry, name: str) -> WorkerClient:
        return WorkerClient(name, registry=registry, timeout=300.0)

    def arrivals(registry: Registry, name: str, prompt: list[int]) -> list[float]:
        times: list[float] = []
        with client(registry, name) as w:
            for event in w.infer(prompt, max_tokens=args.tokens, temperature=0.0):
                if isinstance(event, TokenEvent) and event.token is not None:
                    times.append(time.perf_counter())
        return times

    def streams(registry: Registry, name: str, prompts: list[list[int]]) -> float:
        out: list[list[float]] = [[] for _ in prompts]
        go = threading.Barrier(len(prompts))

        def one(i: int) -> None:
            go.wait()
            out[i] = arrivals(registry, name, prompts[i])

        threads = [threading.Thread(target=one, args=(i,)) for i in range(len(prompts))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        return steady_rate(out)

    def saved_entry(w: WorkerClient, deadline_s: float = 60.0) -> int:
        """Wait until the worker lists an idle entry of the long prompt as saved;
        the KV cells in use then."""
        deadline = time.monotonic() + deadline_s
        while time.monotonic() < deadline:
            status = w.status_from_loop().status
            if any(e.saved and e.tokens >= PROMPT_TOKENS for e in status.idle_entries):
                return status.kv_cells_used
            time.sleep(0.01)
        raise TimeoutError("the long prompt's row was never reported published")

    def one_round(registry: Registry, name: str, prompts: list[list[int]]) -> None:
        with client(registry, name) as w:
            w.complete(long_prompt, max_tokens=1, temperature=0.0)
            saved_entry(w)
            rates[(name, 1)].append(streams(registry, name, prompts[:1]))
            cells[(name, 1)].append(w.status_from_loop().status.kv_cells_used)
            rates[(name, 4)].append(streams(registry, name, prompts[1:]))
            cells[(name, 4)].append(w.status_from_loop().status.kv_cells_used)

    rates: dict[tuple[str, int], list[float]] = {(v, k): [] for v in VARIANTS for k in (1, 4)}
    cells: dict[tuple[str, int], list[int]] = {(v, k): [] for v in VARIANTS for k in (1, 4)}
    loads: list[float] = []
    with tree(("keep",)) as registry, client(registry, "keep") as w:
        long_prompt = w.tokenize(prompt_text("idle-release", 2000))[:PROMPT_TOKENS]
        short = [
            [w.tokenize(prompt_text(f"r{r}s{i}", 20)) for i in range(5)] for r in range(args.rounds)
        ]
    with contextlib.ExitStack() as stack:
        shared = None if args.fresh else stack.enter_context(tree(VARIANTS))
        for rnd in range(args.rounds):
            order = VARIANTS if rnd % 2 == 0 else VARIANTS[::-1]
            for name in order:
                if shared is not None:
                    one_round(shared, name, short[rnd])
                    continue
                with tree((name,)) as registry:
                    one_round(registry, name, short[rnd])
            loads.append(round(os.getloadavg()[0], 2))
            print(f"round {rnd + 1}/{args.rounds} done, load {loads[-1]}", flush=True)

    def spread(values: list[float]) -> str:
        return f"{statistics.median(values):7.1f} ({min(values):.1f}-{max(values):.1f})"

    mode = "a fresh tree per round" if args.fresh else "one tree through every round"
    print(f"\nthreads {n}, {args.tokens} tokens per stream, {args.rounds} rounds, {mode}")
    print(f"load after each round: {loads}")
    print("streams  variant  tok/s median (range)     KV cells after")
    for k in (1, 4):
        for v in VARIANTS:
            print(f"{k:7d}  {v:7s}  {spread(rates[(v, k)])}  {cells[(v, k)]}")
        ratios = [r / k_ for r, k_ in zip(rates[("release", k)], rates[("keep", k)], strict=True)]
        print(f"{k:7d}  release/keep per round: {[round(x, 3) for x in ratios]}")


if __name__ == "__main__":
    main()
