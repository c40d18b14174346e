"""The model worker end to end: warm TTFT, concurrent streams, busy neighbours (issue 8).

    python -m bench.worker_bench [--rounds 5] [--tokens 128] [--quick] [--no-record]
                                 [--flash-attn auto|off|on]

A real supervisor starts cache-meta and two workers of the default model
(``n_threads`` = cores, ``n_ctx`` 4096, ``n_seq_max`` 4, ``n_batch`` 512,
the default cache policy); the bench drives them through
:class:`~llamad.model.worker_client.WorkerClient` over the actors runtime,
from this process. Worker ``ram`` saves to the ``ram`` tier (the default);
worker ``disk`` is the same model with its cache view saving to, and
restoring from, the ``disk`` tier only (``WorkerSpec.cache_view``).

**TTFT** is the time from the client sending an ``infer`` request (token
ids, greedy, ``max_tokens=1``) to the first ``token`` event arriving at the
client. At 512, 1024 and 2048 tokens, in every round:

* ``cold``: a fresh prompt (a leading nonce, so no row shares a prefix with
  it), on each worker; its finish save makes the row the warm paths hit;
* ``ram``: the same prompt again on worker ``ram`` (an exact hit, read in
  place from shared memory), then ``ram again`` (the segment already mapped);
* ``disk``: the same prompt again on worker ``disk``, with the page cache as
  the save left it, and ``disk, pages dropped`` (``POSIX_FADV_DONTNEED`` on the
  row's file first, untimed); their order alternates between rounds.

Every request's finish save is published before the next request is sent
(polled through cache-meta, untimed): a warm hit then measures its restore,
not another row's 47 MB write on the same two cores.

Beside each path the report shows where the time went: the worker's own
``stats`` (queue, restore, prefill: on a warm path the held-back last token
decoded alone, unless the row keeps the logits of the prompt's end and the
first token is sampled from them, SPEC M3's memoised primer) and, from the
worker's status board, that last decode's duration and thread count (the M14
governor chooses it; ``-`` when the request decoded nothing) and whether the
first token came from stored logits.

**Decode** tok/s is measured on the client from token arrival times, over
the window in which every stream of a scenario is decoding (from the last
first token to the first last token): ``alone``, one stream on one worker;
``4 streams`` on one worker; ``two workers``, one stream on each at once
(total); ``hogs``, one stream with a busy-loop Python process per core
running (killed however the scenario ends). The scenarios' order alternates
between rounds, after one unrecorded warm-up round of everything.

Bars (issue 8): warm 2048-token TTFT from ``ram`` <= 25 ms; 4 streams'
aggregate >= 1.6x one stream; two busy workers' total >= 0.9x one worker
alone; with a hog per core, decode >= 0.25x quiet. The verdict is computed
here: "met" only when every round clears the bar, "within noise" when the bar
lies inside the rounds' spread, else below (or above) bar (tables and
verdicts: :mod:`bench.worker_bench_report`). Results are written only by this
script, with the load average at start and end; ``--flash-attn off|on`` runs
the workers with flash attention forced (recorded as ``worker-fa-<value>``).
A result is ``worker-<date>.json`` (every round's TTFTs with the worker's stats,
every stream's token arrival times; :func:`bench.worker_bench_report.round_data`)
and the ``.md`` :func:`bench.worker_bench_report.render` makes of it.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import random
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import msgspec

from bench.common import record, show
from bench.hogs import Hogs
from bench.worker_bench_report import (
    SCENARIOS,
    SIZES,
    Decode,
    Round,
    Ttft,
    governor_info,
    round_data,
    threads_of,
)

if TYPE_CHECKING:
    from llamad.model.results import Completion
    from llamad.model.status_board import WorkerSnapshot
    from llamad.model.worker_client import WorkerClient

ROOT = Path(__file__).resolve().parents[1]
MIN_ROUNDS = 5
N_CTX, N_BATCH, N_SEQ = 4096, 512, 4
RENDER = "bench.worker_bench_report:render"
_WORDS = (
    "river stone lamp cloud paper garden mirror copper harbor winter signal orchard "
    "lantern meadow thunder canvas silver market bridge forest candle window ladder "
    "quarry violet engine sparrow granite compass velvet ember island tunnel beacon"
)
WORDS = tuple(_WORDS.split())


def prompt_text(nonce: str, words: int) -> str:
    """About ``words`` words; the nonce leads, so no two nonces share a prefix row."""
    rng = random.Random(nonce)
    return f"Record {nonce}: " + " ".join(rng.choice(WORDS) for _ in range(words))


# -- the tree --------------------------------------------------------------------------


class Tree:
    """cache-meta and workers ``ram`` and ``disk`` under one supervisor."""

    def __init__(self, cores: int, flash_attn: str = "auto") -> None:
        from llamad import paths  # noqa: PLC0415
        from llamad.actors import Registry  # noqa: PLC0415
        from llamad.cache.sup import meta_child_spec  # noqa: PLC0415
        from llamad.cache.tier_kind import TierKind  # noqa: PLC0415
        from llamad.llama_ffi import ContextOptions, FlashAttn  # noqa: PLC0415
        from llamad.model.cache_view_config import CacheViewConfig  # noqa: PLC0415
        from llamad.model.config import WorkerConfig  # noqa: PLC0415
        from llamad.model.worker_spec import WorkerSpec, worker_child_spec  # noqa: PLC0415
        from llamad.supervisor import Supervisor, SupervisorSpec, SupFlags  # noqa: PLC0415
        from llamad.testing import scratch_settings  # noqa: PLC0415

        self.settings = scratch_settings(prefix="lwb", ram_quota=1 << 30, disk_quota=1 << 30)
        context = ContextOptions(
            n_ctx=N_CTX,
            n_batch=N_BATCH,
            n_seq_max=N_SEQ,
            n_ubatch=N_BATCH,
            kv_unified=True,
            n_threads=cores,
            n_threads_batch=cores,
            flash_attn=FlashAttn[flash_attn.upper()],
        )
        disk = CacheViewConfig(save_tier=TierKind.DISK, restore_tiers=frozenset({TierKind.DISK}))
        self.specs = {
            name: WorkerSpec(
                model_id=name,
                model_path=str(paths.default_model_path()),
                context=context,
                worker=WorkerConfig(n_ctx=N_CTX, n_batch=N_BATCH, n_seq_max=N_SEQ, max_queue=16),
                cache=self.settings,
                cache_view=view,
            )
            for name, view in (("ram", CacheViewConfig()), ("disk", disk))
        }
        children = [meta_child_spec(self.settings)]
        children += [worker_child_spec(spec) for spec in self.specs.values()]
        assert self.settings.registry_root is not None
        self.registry = Registry(self.settings.registry_root)
        self.sup = Supervisor(
            SupervisorSpec("worker_bench", SupFlags(intensity=1, period=60), tuple(children))
        )

    def __enter__(self) -> Tree:
        from llamad.testing import discard_scratch  # noqa: PLC0415

        try:
            self.sup.start()
        except BaseException:
            discard_scratch(self.settings)
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        from llamad.testing import discard_scratch  # noqa: PLC0415

        try:
            self.sup.stop(120)
        finally:
            discard_scratch(self.settings)

    def client(self, name: str) -> WorkerClient:
        from llamad.model.worker_client import WorkerClient  # noqa: PLC0415

        return WorkerClient(name, registry=self.registry, timeout=300.0)

    def row_file(self, key: bytes | None, timeout: float = 60.0) -> str:
        """Wait until row ``key`` is published; its file."""
        from llamad.cache.client import CacheClient  # noqa: PLC0415

        assert key is not None, "the request saved no row"
        deadline = time.monotonic() + timeout
        with CacheClient.from_settings(self.settings, timeout=timeout + 5) as cache:
            # The writer reserves the save on its own thread: until it has,
            # cache-meta knows no save to wait for and answers a miss at once.
            while (ref := cache.lookup_exact_or_wait(key, 1.0)) is None:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"row {key.hex()} was never published")
                time.sleep(0.005)
            cache.checkin(ref.pin)
            return str(ref.location)

    def wait_idle(self, name: str, timeout: float = 60.0, *, admitted: int = -1) -> WorkerSnapshot:
        """Until the worker holds no request (its status board says so) and has
        admitted more than ``admitted`` requests; the snapshot it published then.

        ``admitted`` matters for a request that decodes nothing (a first token
        from stored logits, ``max_tokens=1``): the worker delivers its events
        before it publishes, and the board it published before the request
        already reads idle."""
        from llamad.model.status_board import read_status, status_path  # noqa: PLC0415

        board = status_path(self.registry.root, self.specs[name].actor_name)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            snap = read_status(board)
            if (
                snap is not None
                and snap.busy_since is None
                and not snap.status.pending_len
                and snap.requests_total > admitted
            ):
                return snap
            time.sleep(0.005)
        raise TimeoutError(f"worker {name} still busy after {timeout} s")


def drop_pages(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


# -- measurements ----------------------------------------------------------------------


def ttft(tree: Tree, name: str, client: WorkerClient, tokens: list[int]) -> tuple[Ttft, Completion]:
    """Client send to first token event, one greedy token; then, once the
    worker is idle, the duration of its last decode (the one that computed
    the first token's logits) from its status board, or none when the first
    token was sampled from the logits its restored row keeps (the board's
    tick and stored-logits counts, read before and after, tell which)."""
    from llamad.model.results import TokenEvent  # noqa: PLC0415

    ahead = tree.wait_idle(name)
    before = ahead.status
    t0 = time.perf_counter()
    first = None
    stream = client.infer(tokens, max_tokens=1, temperature=0.0)
    for event in stream:
        if first is None and isinstance(event, TokenEvent):
            first = time.perf_counter()
    result = stream.result
    assert first is not None and result is not None, "no token before the stream ended"
    snap = tree.wait_idle(name, admitted=ahead.requests_total)
    decoded = snap.status.ticks > before.ticks
    from_logits = snap.status.stored_logits_hits > before.stored_logits_hits
    measured = Ttft(
        (first - t0) * 1e3,
        msgspec.structs.asdict(result.stats),
        snap.last_tick_ms if decoded else 0.0,
        threads_of(snap) if decoded else None,
        from_logits=from_logits,
    )
    return measured, result


def prompt_tokens(client: WorkerClient, n: int, nonce: str) -> list[int]:
    tokens = client.tokenize(prompt_text(nonce, n))
    assert len(tokens) >= n, f"{len(tokens)} tokens, wanted {n}"
    return tokens[:n]


def decode(tree: Tree, workers: Sequence[str], max_tokens: int, tag: str) -> Decode:
    """One stream per entry of ``workers``, all sent at once, each from its own
    thread and client (connected before the start)."""
    from llamad.model.results import TokenEvent  # noqa: PLC0415

    n = len(workers)
    ready = threading.Barrier(n + 1, timeout=60)
    arrivals: list[list[float]] = [[] for _ in range(n)]
    finish = [""] * n
    errors: list[BaseException] = []

    def run(i: int) -> None:
        try:
            with tree.client(workers[i]) as c:
                c.tokenize("warm the connection")
                k = 10 * i + 1
                prompt = f"Count up by one, one number per line.\n{k}\n{k + 1}\n{k + 2}\n"
                ready.wait()
                stream = c.infer(prompt, max_tokens=max_tokens, temperature=0.0)
                for event in stream:
                    if isinstance(event, TokenEvent) and event.token is not None:
                        arrivals[i].append(time.perf_counter())
                assert stream.result is not None
                finish[i] = stream.result.finish_reason.value
        except BaseException as exc:
            errors.append(exc)
            with contextlib.suppress(threading.BrokenBarrierError):
                ready.abort()

    runners = [threading.Thread(target=run, args=(i,), name=f"{tag}-{i}") for i in range(n)]
    for t in runners:
        t.start()
    with contextlib.suppress(threading.BrokenBarrierError):
        ready.wait()
    for t in runners:
        t.join(300)
    if errors:
        raise errors[0]
    threads = {name: threads_of(tree.wait_idle(name)) for name in sorted(set(workers))}
    return Decode(arrivals, finish, threads)


# A busy loop that also ends if the bench dies without reaching its finally
# (every ~20 ms it checks that its parent is still the bench).
def ttft_round(tree: Tree, clients: dict[str, WorkerClient], i: int) -> dict[tuple[str, int], Ttft]:
    """Every TTFT path at every size; sizes, workers and the disk variants alternate."""
    got: dict[tuple[str, int], Ttft] = {}
    sizes = SIZES if i % 2 == 0 else tuple(reversed(SIZES))
    workers = ("ram", "disk") if i % 2 == 0 else ("disk", "ram")
    for n in sizes:
        for name in workers:
            c = clients[name]
            tokens = prompt_tokens(c, n, f"{name}-{i}-{n}-{os.urandom(4).hex()}")
            got["cold" if name == "ram" else "cold (disk worker)", n], cold = ttft(
                tree, name, c, tokens
            )
            path = tree.row_file(cold.finish_key)
            order = ["ram", "ram again"] if name == "ram" else ["disk", "disk, pages dropped"]
            if name == "disk" and i % 2:
                order.reverse()
            for kind in order:
                if kind == "disk, pages dropped":
                    drop_pages(path)
                got[kind, n], warm = ttft(tree, name, c, tokens)
                if warm.finish_key is not None:
                    # Its finish save (a 47 MB write at 2048 tokens) off the
                    # clock: the next hit measures the restore, not the write.
                    tree.row_file(warm.finish_key)
    return got


def decode_round(tree: Tree, i: int, cores: int, max_tokens: int) -> dict[str, Decode]:
    runs: dict[str, Callable[[], Decode]] = {
        "alone": lambda: decode(tree, ["ram"], max_tokens, "alone"),
        "4 streams": lambda: decode(tree, ["ram"] * 4, max_tokens, "four"),
        "two workers": lambda: decode(tree, ["ram", "disk"], max_tokens, "pair"),
    }

    def beside_hogs() -> Decode:
        with Hogs(cores):
            time.sleep(0.3)  # let them reach the run queues
            return decode(tree, ["ram"], max_tokens, "hogs")

    runs["hogs"] = beside_hogs
    order = SCENARIOS if i % 2 == 0 else tuple(reversed(SCENARIOS))
    return {s: runs[s]() for s in order}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=None, help=f"recorded rounds ({MIN_ROUNDS})")
    ap.add_argument("--tokens", type=int, default=None, help="max_tokens per stream (128)")
    ap.add_argument("--quick", action="store_true", help="1 round, 32 tokens, not recorded")
    ap.add_argument("--no-record", action="store_true")
    ap.add_argument(
        "--flash-attn",
        choices=("auto", "off", "on"),
        default="auto",
        help="the workers' flash attention (auto: the binding's default); "
        "other than auto records worker-fa-<value>-<date>.md",
    )
    args = ap.parse_args()
    record_it = not (args.no_record or args.quick)
    n_rounds = args.rounds if args.rounds is not None else (1 if args.quick else MIN_ROUNDS)
    max_tokens = args.tokens if args.tokens is not None else (32 if args.quick else 128)
    if n_rounds < 1 or max_tokens < 8:
        ap.error("--rounds must be >= 1 and --tokens >= 8")
    if record_it and n_rounds < MIN_ROUNDS:
        ap.error(f"a recorded result needs --rounds >= {MIN_ROUNDS} (or pass --no-record)")
    os.chdir(ROOT)
    os.environ.setdefault("LLAMAD_LOG_LEVEL", "warning")
    cores = len(os.sched_getaffinity(0))
    load_start = os.getloadavg()
    t_start = time.monotonic()
    rounds: list[Round] = []
    loads: list[float] = []
    with Tree(cores, args.flash_attn) as tree:
        clients = {name: tree.client(name) for name in tree.specs}
        try:
            for i in range(-1, n_rounds):  # round -1: warm-up, not recorded
                loads.append(os.getloadavg()[0])
                r = Round(ttft_round(tree, clients, i), decode_round(tree, i, cores, max_tokens))
                line = ", ".join(f"{s} {d.tok_s:.1f}" for s, d in r.decode.items())
                what = "warm-up" if i < 0 else f"round {i + 1}/{n_rounds}"
                print(
                    f"{what}: ram TTFT {r.ttft['ram', SIZES[-1]].ms:.2f} ms at {SIZES[-1]}, "
                    f"cold {r.ttft['cold', SIZES[-1]].ms:.0f} ms; tok/s {line}",
                    file=sys.stderr,
                    flush=True,
                )
                if i >= 0:
                    rounds.append(r)
            snaps = {name: tree.wait_idle(name) for name in tree.specs}
        finally:
            for c in clients.values():
                c.close()
    params = {
        "cores": cores,
        "flash_attn": args.flash_attn,
        "n_ctx": N_CTX,
        "n_seq_max": N_SEQ,
        "n_batch": N_BATCH,
        "rounds": n_rounds,
        "max_tokens": max_tokens,
        "load_start": list(load_start),
        "load_end": list(os.getloadavg()),
        "loads": loads,
        "wall_s": time.monotonic() - t_start,
        "governor": {name: governor_info(snap) for name, snap in snaps.items()},
    }
    data = {"rounds": [round_data(r) for r in rounds]}
    print(show(RENDER, params, data))
    if record_it:
        title = "The model worker: warm TTFT, streams, busy neighbours (issue 8)"
        name = "worker" if args.flash_attn == "auto" else f"worker-fa-{args.flash_attn}"
        if args.flash_attn != "auto":
            title += f", flash attention {args.flash_attn}"
        print(f"recorded {record(name, title, RENDER, params, data)}")


if __name__ == "__main__":
    main()
