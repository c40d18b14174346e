"""Cache-affinity routing against random placement, over three daemons (issue 20).

Three daemons (distinct runtime directories and cache instances) serve the
default model. A workload of ``PREFIXES`` shared prefixes (a system prompt
of some 200 tokens each), each asked ``PER_PREFIX`` times with a distinct
question, is shuffled and sent one request at a time (``max_tokens`` 1):

- ``random``: each request to a daemon picked at random (a ``Client`` per
  daemon), what a load balancer that knows nothing of the caches does;
- ``routed``: every request through one ``Client(endpoints=[a, b, c])``
  (``llamad.client.router``: the longest cached prefix from the KV events,
  else the least loaded, ties by a hash of the prompt's start).

Each placement gets its own prefixes (no cache state is shared between
them). Measured per placement: the prompt tokens the cache supplied
(``cache_delta.read``) over all prompt tokens (the figure that matters), the
requests that were not cold (any reuse counts, the few tokens every system
prompt opens with included), the requests per daemon, and the median time
of a request.

    PYTHONPATH=src .venv/bin/python -m bench.routing_bench [--no-record]
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import record, show, table
from llamad import Client, paths
from llamad.testing import Launcher

DAEMONS = 3
PREFIXES = 6
PER_PREFIX = 6
RENDER = "bench.routing_bench:report"

_WORDS = [
    "river",
    "stone",
    "lamp",
    "cloud",
    "paper",
    "garden",
    "mirror",
    "copper",
    "harbor",
    "lantern",
    "meadow",
    "violet",
]


def _system(seed: int) -> str:
    rng = random.Random(seed)
    body = " ".join(rng.choice(_WORDS) for _ in range(150))
    return f"System {seed}: you are a careful assistant. Context: {body}."


def _workload(family: int) -> list[str]:
    prompts = [
        f"{_system(family * 100 + p)}\nQuestion {q}: what is item {q * 7 + p}?"
        for p in range(PREFIXES)
        for q in range(PER_PREFIX)
    ]
    random.Random(family).shuffle(prompts)
    return prompts


@contextmanager
def _daemon(i: int) -> Iterator[Launcher]:
    d = Launcher(prefix="lrb-", instance=f"rb{i}{uuid.uuid4().hex[:8]}")
    d.runtime.mkdir(mode=0o700)
    d.write_config(
        f"""
[daemon]
runtime_dir = "{d.runtime}"
state_dir = "{d.state}"
log_format = "json"
log_level = "warning"
[cache]
instance = "{d.instance}"
[cache.ram_file]
quota = 0
[security]
model_dirs = ["{paths.default_model_path().parent}"]
[models.smol]
path = "default"
n_ctx = 2048
n_seq_max = 4
n_threads = 1
n_threads_batch = 1
"""
    )
    try:
        yield d
    finally:
        d.close(120)


def _place(clients: dict[str, Client], prompts: list[str], routed: Client | None) -> dict[str, Any]:
    rng = random.Random(7)
    read = total = warm = 0
    used: Counter[str] = Counter()
    times: list[float] = []
    for prompt in prompts:
        t0 = time.monotonic()
        if routed is not None:
            stream = routed.infer("smol", prompt, max_tokens=1, temperature=0.0)
            reply = stream.completion()
            used[stream.endpoint] += 1
        else:
            endpoint = rng.choice(sorted(clients))
            reply = clients[endpoint].complete("smol", prompt, max_tokens=1, temperature=0.0)
            used[endpoint] += 1
        times.append(time.monotonic() - t0)
        read += reply.cache_delta.read
        total += reply.stats.prompt_tokens
        warm += reply.cache_hit_kind != "cold"
    return {
        "requests": len(prompts),
        "prompt_tokens": total,
        "cache_read": read,
        "warm": warm,
        "daemons_used": sorted(used.values(), reverse=True),
        "median_s": statistics.median(times),
    }


def run() -> dict[str, Any]:
    with ExitStack() as stack:
        daemons = [stack.enter_context(_daemon(i)) for i in range(DAEMONS)]
        for d in daemons:
            d.start()
        for d in daemons:
            d.wait_routed(["smol"], timeout=300)
        endpoints = [d.endpoint for d in daemons]
        clients = {e: stack.enter_context(Client(e)) for e in endpoints}
        routed = stack.enter_context(Client(endpoints=endpoints))
        return {
            "random": _place(clients, _workload(1), None),
            "routed": _place(clients, _workload(2), routed),
        }


def report(params: dict[str, Any], data: dict[str, Any]) -> str:
    rows = []
    for name in ("random", "routed"):
        r = data[name]
        rows.append(
            [
                name,
                f"{r['cache_read'] / r['prompt_tokens']:.0%}",
                f"{r['warm']}/{r['requests']}",
                " / ".join(str(n) for n in r["daemons_used"]),
                f"{r['median_s'] * 1000:.0f}",
            ]
        )
    head = ["placement", "prompt tokens from cache", "requests not cold", "per daemon", "median ms"]
    return (
        f"{params['daemons']} daemons, {params['prefixes']} shared prefixes of about 200 tokens"
        f" asked {params['per_prefix']} times each, shuffled, one request at a time"
        " (max_tokens 1); each placement with prefixes of its own.\n\n" + table(head, rows) + "\n"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--no-record", action="store_true")
    args = parser.parse_args()
    params = {"daemons": DAEMONS, "prefixes": PREFIXES, "per_prefix": PER_PREFIX}
    data = run()
    print(show(RENDER, params, data))
    if not args.no_record:
        print(
            record(
                "routing", "Cache-affinity routing against random placement", RENDER, params, data
            )
        )


if __name__ == "__main__":
    main()
