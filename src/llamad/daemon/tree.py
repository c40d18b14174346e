"""The daemon's supervision tree (ARCHITECTURE: process topology), built from a loaded config.

::

    llamad (root, one_for_one, 5 restarts in 60 s)        service llamad.root
    ├── cache_sup (rest_for_one, 5 in 30 s, liveness 30 s, hosted) service llamad.cache_sup
    │   └── cache-meta
    ├── model_sup (simple_one_for_one, 25 in 60 s, liveness 30 s, hosted) service llamad.model_sup
    │   └── model.<id> ...   one worker per model, permanent, started by the front
    ├── front (permanent)                                 actor llamad.front on config.endpoint
    └── gateway (permanent, [http] enabled)               HTTP on http.host:http.port

``cache_sup`` and ``model_sup`` are hosted on threads of the root
(:mod:`llamad.supervisor.hosted`): a supervisor holds no state a crash must
not take down, and an interpreter each cost ~31 MB of RSS (SPEC P9).

Start order is the list order, shutdown the reverse: the HTTP gateway stops
first (a client of the front and the workers like any other), then the front
stops taking requests, then every worker runs its shutdown saves (all at once,
bounded by the template's shutdown), then cache-meta flushes and exits.

Restart decisions (``docs/internals/daemon.md``):

- **Workers are permanent**: a model that is loaded should be served, so a
  worker is restarted whatever ended it (a crash, a hung tick, an operator's
  SIGTERM). ``unload`` and ``keep_alive`` stop it with ``terminate_child``,
  which never restarts.
- **Giving up on one model is the front's**, per model
  (:data:`llamad.front.table.MODEL_RESTARTS` in
  :data:`~llamad.front.table.MODEL_PERIOD_S`): ``model_sup`` has one restart
  window for all its workers, and one model crashing on every load must not
  exhaust it. ``model_sup``'s own intensity is well above what the front lets
  one model use, so it escalates only when many workers fail together (or
  the front is down while one crash-loops): a failure of the whole, which
  the root answers by restarting ``model_sup`` (the front then loads every
  model again).
- **The root** restarts ``cache_sup``, ``model_sup`` or the front on their
  own (``one_for_one``: a front crash leaves every worker serving); more than
  5 restarts in 60 s and the daemon exits non-zero for systemd to act.
- **Every child of the root heartbeats**, the two supervisors included
  (:data:`SUPERVISOR_LIVENESS_S`): a supervisor beats from its loop and while
  it waits on a start or a stop, so its beat says that its own liveness
  checks run. The root kills and restarts a silent one like any hung child,
  and pings systemd's watchdog only while all of them are on time
  (``docs/internals/operations.md``).
"""

from __future__ import annotations

from typing import Any, Final

import msgspec

from llamad.cache.sup import cache_sup_spec
from llamad.config import LlamadConfig
from llamad.config.convert import cache_policy
from llamad.front.load_request import TemplateLimits
from llamad.model.worker_spec import worker_template
from llamad.supervisor.spec import (
    ChildSpec,
    Restart,
    Start,
    Strategy,
    SupervisorSpec,
    SupFlags,
    supervisor_child,
)

__all__ = [
    "CACHE_SUP_SERVICE",
    "FRONT_ENTRY",
    "GATEWAY_ENTRY",
    "MODEL_SUP_SERVICE",
    "ROOT_NAME",
    "ROOT_SERVICE",
    "daemon_spec",
    "template_limits",
]

ROOT_NAME: Final = "llamad"
ROOT_SERVICE: Final = "llamad.root"
CACHE_SUP_SERVICE: Final = "llamad.cache_sup"
MODEL_SUP_SERVICE: Final = "llamad.model_sup"
FRONT_ENTRY: Final = "llamad.front.front_proc:run_front"
GATEWAY_ENTRY: Final = "llamad.gateway.proc:run_gateway"

ROOT_INTENSITY: Final = 5
ROOT_PERIOD_S: Final = 60.0
MODEL_SUP_INTENSITY: Final = 25
MODEL_SUP_PERIOD_S: Final = 60.0

FRONT_SHUTDOWN_S: Final = 10.0
FRONT_LIVENESS_S: Final = 15.0
GATEWAY_SHUTDOWN_S: Final = 10.0
"""Above the gateway's own grace for open requests (3 s) and its close."""
GATEWAY_LIVENESS_S: Final = 15.0
SUPERVISOR_LIVENESS_S: Final = 30.0
"""``cache_sup``'s and ``model_sup``'s heartbeat window: well above the time
their loop may be busy between two beats (a beat goes out at least every
quarter of it, waits included), and the largest liveness window of the root's
children, which the unit's ``WatchdogSec`` must exceed."""

# The worker template's floor: what a model with default settings needs, so
# a model loaded at run time with defaults is always accepted.
_DEFAULT_LIVENESS_S: Final = 5.0
_DEFAULT_LOAD_TIMEOUT_S: Final = 120.0
_DEFAULT_SAVES_S: Final = 30.0
_SHUTDOWN_MARGIN_S: Final = 10.0  # beyond the shutdown saves: close, flush, exit


def template_limits(config: LlamadConfig) -> TemplateLimits:
    """The timings every worker of this daemon runs with: the largest any
    configured model asks for, and at least the defaults."""
    liveness = [_DEFAULT_LIVENESS_S]
    load = [_DEFAULT_LOAD_TIMEOUT_S]
    saves = [_DEFAULT_SAVES_S]
    for model_id, m in config.models.items():
        liveness.append(m.liveness_s)
        load.append(m.load_timeout_s)
        saves.append(cache_policy(config, model_id).evict_save_timeout_ms / 1000.0)
    return TemplateLimits(
        liveness_s=max(liveness),
        load_timeout_s=max(load),
        shutdown_s=max(saves) + _SHUTDOWN_MARGIN_S,
    )


def front_args(config: LlamadConfig, started_at: float) -> dict[str, Any]:
    """The front's start kwargs: the whole resolved config (it builds run-time
    loads by the same rules), when the daemon started, the template's limits
    and the supervisors' actor names."""
    limits = template_limits(config)
    return {
        "config": msgspec.to_builtins(config),
        "started_at": started_at,
        "limits": {
            "liveness_s": limits.liveness_s,
            "load_timeout_s": limits.load_timeout_s,
            "shutdown_s": limits.shutdown_s,
        },
        "services": {
            "root": ROOT_SERVICE,
            "cache_sup": CACHE_SUP_SERVICE,
            "model_sup": MODEL_SUP_SERVICE,
        },
    }


def gateway_args(config: LlamadConfig, port: int) -> dict[str, Any]:
    """The gateway's start kwargs (:class:`llamad.gateway.settings.GatewaySettings`):
    the ``[http]`` table, the endpoint it is a client of, where it publishes
    its address, and the port it binds (the root's choice for ``port = 0``)."""
    return {
        "settings": {
            "http": msgspec.to_builtins(config.http),
            "endpoint": config.endpoint,
            "runtime_dir": str(config.runtime_dir),
            "port": port,
        }
    }


def daemon_spec(
    config: LlamadConfig, *, started_at: float, http_port: int | None = None
) -> SupervisorSpec:
    """The root supervisor of a daemon running ``config``; ``http_port``: the
    gateway's port (``None``: ``http.port``), left out when ``[http]`` is off."""
    limits = template_limits(config)
    cache = supervisor_child(
        cache_sup_spec(config.cache_settings()),
        service=CACHE_SUP_SERVICE,
        liveness_timeout=SUPERVISOR_LIVENESS_S,
        hosted=True,
    )
    models = supervisor_child(
        SupervisorSpec(
            "model_sup",
            SupFlags(
                strategy=Strategy.SIMPLE_ONE_FOR_ONE,
                intensity=MODEL_SUP_INTENSITY,
                period=MODEL_SUP_PERIOD_S,
            ),
            (
                worker_template(
                    liveness_s=limits.liveness_s,
                    shutdown_s=limits.shutdown_s,
                    load_timeout_s=limits.load_timeout_s,
                    restart=Restart.PERMANENT,
                ),
            ),
        ),
        service=MODEL_SUP_SERVICE,
        liveness_timeout=SUPERVISOR_LIVENESS_S,
        hosted=True,
    )
    front = ChildSpec(
        id="front",
        start=Start(FRONT_ENTRY, (), front_args(config, started_at)),
        restart=Restart.PERMANENT,
        shutdown=FRONT_SHUTDOWN_S,
        liveness_timeout=FRONT_LIVENESS_S,
        start_timeout=60.0,
    )
    children = [cache, models, front]
    if config.http.enabled:
        port = config.http.port if http_port is None else http_port
        children.append(
            ChildSpec(
                id="gateway",
                start=Start(GATEWAY_ENTRY, (), gateway_args(config, port)),
                restart=Restart.PERMANENT,
                shutdown=GATEWAY_SHUTDOWN_S,
                liveness_timeout=GATEWAY_LIVENESS_S,
                start_timeout=60.0,
            )
        )
    return SupervisorSpec(
        ROOT_NAME,
        SupFlags(strategy=Strategy.ONE_FOR_ONE, intensity=ROOT_INTENSITY, period=ROOT_PERIOD_S),
        tuple(children),
    )
