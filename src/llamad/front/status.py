"""The daemon's ``status``: models with their workers' boards, supervisors, cache tiers.

Nothing here waits on a worker: a worker's part is its status board (a file
it publishes, readable in the middle of a long tick). ``model_sup``'s part
comes from the front's own table (fed by ``model_sup``'s events), because
``model_sup`` does not answer ``which_children`` while it starts a worker
(a model load); the root and ``cache_sup`` are asked on the front's
inspection lane, with a short timeout.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import msgspec

from llamad.config import LlamadConfig
from llamad.front.table import ModelEntry, exit_text
from llamad.front.wire import (
    DaemonStatus,
    KvEventsAddress,
    ModelStatus,
    SupervisedChild,
    SupervisorStatus,
    TierUsage,
)
from llamad.model.wire import WorkerSnapshot
from llamad.paths import http_address, kv_events_address
from llamad.supervisor.core import ChildInfo
from llamad.tiers import TierKind

__all__ = ["Supervisors", "daemon_status", "supervisor_status", "tier_usage"]


@dataclass(frozen=True)
class Supervisors:
    """What the inspection lane brought back: each supervisor's children, or why not."""

    root: list[ChildInfo] | str
    cache_sup: list[ChildInfo] | str


def supervisor_status(name: str, children: list[ChildInfo] | str) -> SupervisorStatus:
    if isinstance(children, str):
        return SupervisorStatus(name=name, error=children)
    return SupervisorStatus(
        name=name,
        children=[
            SupervisedChild(
                id=c.id,
                pid=c.pid,
                state=c.state.value,
                restarts=c.restarts,
                # With the cause, a child killed for being hung says so.
                last_exit=None
                if c.last_exit is None
                else exit_text(c.last_exit.exit, c.last_exit.cause),
            )
            for c in children
        ],
    )


def tier_usage(config: LlamadConfig, gauges: dict[str, int]) -> dict[TierKind, TierUsage]:
    """Bytes held (the cache's gauges) against each configured tier's quota."""
    c = config.cache
    quotas = {
        TierKind.RAM: c.ram.quota,
        TierKind.RAM_FILE: c.ram_file.quota,
        TierKind.DISK: c.disk.quota,
    }
    return {
        name: TierUsage(bytes=gauges.get(f"bytes_{name}", 0), quota=quota)
        for name, quota in quotas.items()
        if quota > 0
    }


def daemon_status(
    config: LlamadConfig,
    *,
    started_at: float,
    entries: Iterable[ModelEntry],
    board: Callable[[ModelEntry], WorkerSnapshot | None],
    supervisors: Supervisors,
    gauges: dict[str, int],
) -> DaemonStatus:
    models = []
    model_children = []
    for entry in sorted(entries, key=lambda e: e.model_id):
        models.append(ModelStatus(info=entry.info(), worker=board(entry)))
        model_children.append(
            SupervisedChild(
                id=entry.child_id,
                pid=entry.pid,
                state=entry.state.value,
                restarts=entry.restarts,
                last_exit=entry.last_exit,
            )
        )
    sups = [
        supervisor_status("llamad", supervisors.root),
        supervisor_status("cache_sup", supervisors.cache_sup),
        SupervisorStatus(name="model_sup", children=model_children),
    ]
    return DaemonStatus(
        pid=os.getppid(),  # the root: the front is its child
        uptime_s=round(max(0.0, time.time() - started_at), 3),
        models=models,
        tiers=tier_usage(config, gauges),
        restarts=sum(c.restarts for s in sups for c in s.children),
        supervisors=sups,
        endpoint=config.endpoint,
        started_at=started_at,
        http=_http_url(config),
        kv_events=_kv_events(config),
    )


def _kv_events(config: LlamadConfig) -> KvEventsAddress | None:
    found = kv_events_address(config.runtime_dir) if config.kv_events.enabled else None
    if found is None:
        return None
    try:
        return msgspec.convert(
            {
                k: found[k]
                for k in ("endpoint", "replay_endpoint", "topic", "block_size")
                if k in found
            },
            KvEventsAddress,
        )
    except msgspec.ValidationError:
        return None


def _http_url(config: LlamadConfig) -> str | None:
    found = http_address(config.runtime_dir) if config.http.enabled else None
    url = None if found is None else found.get("url")
    return url if isinstance(url, str) else None
