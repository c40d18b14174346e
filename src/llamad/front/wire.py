"""The front's ops and their wire schemas: the contract between daemon and client.

The front (actor ``llamad.front``, bound on the daemon's client endpoint) is
the control plane: it routes a model id to the worker actor that serves it,
loads and unloads models, and answers status and cache operations. It does
not relay token streams: a client asks ``route`` once per model and then
talks to the worker actor directly (``llamad.model.wire`` has those ops).

=====================  ======  =====================  ===========================================
op                     kind    body                   answer
=====================  ======  =====================  ===========================================
``route``              call    :class:`ModelRef`      :class:`Route` (a configured model that is
                                                      unloaded is loaded first: deferred reply)
``load_model``         stream  :class:`LoadModel`     events :class:`LoadProgress`; END
                                                      :class:`ModelInfo`
``unload``             call    :class:`ModelRef`      ``None``
``list_models``        call    :class:`NoArgs`        ``list[ModelInfo]``
``model_info``         call    :class:`ModelRef`      :class:`ModelInfo`
``status``             call    :class:`NoArgs`        :class:`DaemonStatus`
``counters``           call    :class:`NoArgs`        ``dict[str, int]`` (the cache's counters)
``metrics``            call    :class:`NoArgs`        :class:`MetricsSnapshot` (every worker's
                                                      board, the cache's counters and tiers)
``evict_bytes``        call    :class:`EvictBytes`    ``int``: bytes evicted
``gc``                 call    :class:`NoArgs`        :class:`GcReport`
=====================  ======  =====================  ===========================================

Errors are typed, each its own code: ``model_not_found`` (no such model),
:class:`ModelFailed` (its worker gave up: a failed load, or more crashes than
the restart intensity allows; ``details`` say why), :class:`PathNotAllowed`
(a path outside ``[security].model_dirs`` once symlinks are resolved),
``config_error`` (a bad option, naming the key as ``models.<id>.<key>``;
``details["errors"]`` lists every problem), ``not_gguf`` / ``truncated_gguf``
/ ``model_file_error`` (the file), ``model_load_failed`` (the worker died or
timed out while loading). This module imports no libllama: clients use it.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated, Any, Final

import msgspec

from llamad.actors.ops import NoArgs, OpKind, OpSpec
from llamad.errors import LlamadError, PathNotAllowed
from llamad.model.results import WorkerStatus
from llamad.model.wire import ThreadStatus, WorkerMetrics, WorkerSnapshot
from llamad.tiers import TierKind

__all__ = [
    "EVICT_ALL",
    "FRONT_ACTOR",
    "MAX_KEEP_ALIVE_S",
    "OPS",
    "DaemonStatus",
    "EvictBytes",
    "GcReport",
    "Histogram",
    "KvEventsAddress",
    "LoadModel",
    "LoadProgress",
    "MetricsSnapshot",
    "ModelFailed",
    "ModelInfo",
    "ModelMetrics",
    "ModelRef",
    "ModelState",
    "ModelStatus",
    "NoArgs",
    "PathNotAllowed",
    "Route",
    "SetKeepAlive",
    "SupervisedChild",
    "SupervisorStatus",
    "TierUsage",
]

FRONT_ACTOR: Final = "llamad.front"
"""The front's actor name in the daemon's registry."""

ModelId = Annotated[
    str, msgspec.Meta(min_length=1, max_length=58, pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
]
"""A model id is part of its worker's actor name (``model.<id>``, at most 64 characters)."""


class ModelFailed(LlamadError):
    """The model has no worker and none will be started on its own: its load
    failed, or its worker crashed more often than the restart intensity allows.

    ``details``: ``model_id``, ``error`` (why), ``last_exit`` (the worker's
    last exit in words, if it ran). ``load_model`` tries again.
    """

    code = "model_failed"


class ModelState(StrEnum):
    LOADING = "loading"
    """Its worker is starting: a load, a reload, or a restart after a crash."""
    READY = "ready"
    UNLOADING = "unloading"
    """Its worker is stopping (its shutdown saves run)."""
    UNLOADED = "unloaded"
    """Configured, not running (keep_alive expired, or unloaded): the next ``route`` loads it."""
    FAILED = "failed"
    """Its worker gave up (restart intensity exceeded, or the load failed): see ``error``."""


class ModelRef(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    model_id: ModelId


class Route(msgspec.Struct, frozen=True):
    """Where a model is served: its worker's actor name in the registry at
    ``registry_root``, and that actor's ``instance`` when the route was given.

    When the daemon serves tcp, ``tcp_port`` is the port the worker listens on
    too (on the host the client reached the front through: a client that
    cannot read the registry connects there), and ``server_key`` the CURVE
    public key it serves with (``None``: no CURVE).
    """

    model_id: str
    actor: str
    registry_root: str
    instance: str
    tcp_port: int | None = None
    server_key: str | None = None


class LoadModel(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """``load_model``: ``options`` are the keys of a ``[models.<id>]`` table
    (validated by the config's rules; an error names the key). ``path``
    ``None``: the configured model's own path."""

    model_id: ModelId
    path: str | None = None
    options: dict[str, Any] = msgspec.field(default_factory=dict)


MAX_KEEP_ALIVE_S: Final = 10 * 365 * 86400.0
"""Longest ``keep_alive`` a request may set (ten years): longer is "forever", ``None``."""


class SetKeepAlive(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """``set_keep_alive``: unload ``model_id``'s worker once it has been idle
    ``keep_alive_s`` seconds (``None``: never), until the next load of its
    config or another ``set_keep_alive``. 0 unloads it at the next check
    once nothing runs on it."""

    model_id: ModelId
    keep_alive_s: Annotated[float, msgspec.Meta(ge=0.0, le=MAX_KEEP_ALIVE_S)] | None = None


class GcReport(msgspec.Struct, frozen=True):
    """``gc``'s reply: rows evicted and bytes freed by the cache's sweep,
    copies whose files had vanished (``missing``), leftovers reaped."""

    evicted: int
    bytes_freed: int
    missing: int
    reaped: int


class LoadProgress(msgspec.Struct, frozen=True):
    """A ``load_model`` stream event: the share of the model file loaded."""

    fraction: float


class ModelInfo(msgspec.Struct, frozen=True):
    """One model as the front knows it."""

    model_id: str
    path: str
    state: ModelState
    n_ctx: int = 0
    n_seq_max: int = 0
    keep_alive_s: float | None = None
    loaded_at: float | None = None
    """Wall clock (``time.time()``) of the last successful load."""
    restarts: int = 0
    """Times its worker was restarted after a crash since it was loaded."""
    last_exit: str | None = None
    """Its worker's last exit in words (``"signal SIGKILL"``), if it ended once."""
    error: str | None = None
    """Why it failed (state ``failed``)."""
    pid: int | None = None
    """Its worker's pid while it runs."""
    deterministic: bool = False
    """Its worker runs with the ``deterministic`` option (the untiled paths: a
    greedy reply does not depend on what shares its batch; see the README)."""


class TierUsage(msgspec.Struct, frozen=True):
    bytes: int
    quota: int


class ModelStatus(msgspec.Struct, frozen=True):
    info: ModelInfo
    worker: WorkerSnapshot | None = None
    """From the worker's status board (never waiting on a busy worker)."""


class SupervisedChild(msgspec.Struct, frozen=True):
    """One child of a supervisor of the daemon's tree (``which_children``)."""

    id: str
    pid: int | None
    state: str
    restarts: int = 0
    last_exit: str | None = None


class SupervisorStatus(msgspec.Struct, frozen=True):
    """A supervisor and its children; ``error``: it did not answer in time
    (busy starting or restarting a child)."""

    name: str
    children: list[SupervisedChild] = msgspec.field(default_factory=list)
    error: str | None = None


class KvEventsAddress(msgspec.Struct, frozen=True):
    """A daemon's KV event stream (vLLM's format, ``docs/internals/kv-events.md``)."""

    endpoint: str
    replay_endpoint: str | None = None
    topic: str = ""
    block_size: int = 16


class DaemonStatus(msgspec.Struct, frozen=True):
    pid: int
    uptime_s: float
    models: list[ModelStatus] = msgspec.field(default_factory=list)
    tiers: dict[TierKind, TierUsage] = msgspec.field(default_factory=dict)
    restarts: int = 0
    """Restarts the daemon's supervisors carried out since it started."""
    supervisors: list[SupervisorStatus] = msgspec.field(default_factory=list)
    """``llamad`` (the root), ``cache_sup`` and ``model_sup`` with their children."""
    endpoint: str = ""
    started_at: float = 0.0
    """Wall clock (``time.time()``) when the daemon started."""
    http: str | None = None
    """The HTTP gateway's base URL while it serves (``<runtime_dir>/http.json``)."""
    kv_events: KvEventsAddress | None = None
    """Where cache-meta publishes KV events (``<runtime_dir>/kv_events.json``)."""


class Histogram(msgspec.Struct, frozen=True):
    """A latency histogram with its bounds (seconds): ``counts[i]`` observations
    ``<= bounds[i]`` and above the bound before, the last above every bound;
    ``sum`` of them all."""

    bounds: list[float]
    counts: list[int]
    sum: float

    @property
    def count(self) -> int:
        return sum(self.counts)


class ModelMetrics(msgspec.Struct, frozen=True):
    """One model in a :class:`MetricsSnapshot`.

    From the front's table: ``state``, ``n_ctx``, ``restarts`` (its worker's
    restarts after a crash since it was loaded). From its worker's status
    board, while a worker runs (else ``None``, empty): ``status`` (queue,
    running sequences, KV cells), ``threads`` (the thread governor),
    ``requests_total``, ``counts`` (what the worker counted since it
    started) and ``histograms`` (``ttft``, ``itl``, ``e2e``, ``queue``, with
    their bounds). A worker that restarts starts counting again from zero.
    """

    model_id: str
    state: ModelState
    n_ctx: int = 0
    restarts: int = 0
    pid: int | None = None
    status: WorkerStatus | None = None
    threads: ThreadStatus | None = None
    requests_total: int = 0
    counts: WorkerMetrics | None = None
    histograms: dict[str, Histogram] = msgspec.field(default_factory=dict)


class MetricsSnapshot(msgspec.Struct, frozen=True):
    """``metrics``: the whole daemon in one read, gathered without waiting on
    any worker (their status boards are files) or on cache-meta (its counters
    are a shared file): every model, the cache's counters (``cache``: the
    ``counters`` op's names; empty while cache-meta starts) and each tier's
    bytes against its quota. ``at`` and ``started_at``: wall clock.
    Rendered as Prometheus text by :mod:`llamad.client.prometheus`."""

    at: float
    started_at: float
    uptime_s: float
    models: list[ModelMetrics] = msgspec.field(default_factory=list)
    cache: dict[str, int] = msgspec.field(default_factory=dict)
    tiers: dict[TierKind, TierUsage] = msgspec.field(default_factory=dict)


EVICT_ALL: Final = 2**62
"""``evict_bytes`` asks for at most this many bytes (4 EiB, past any cache);
a larger ``n`` is clamped to it, meaning "everything that can go"."""


class EvictBytes(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """``evict_bytes``: any ``n >= 0`` (up to 2**64 - 1 on the wire), clamped
    to :data:`EVICT_ALL` by the front."""

    n: Annotated[int, msgspec.Meta(ge=0)]
    tiers: list[TierKind] | None = None


def _call(name: str, body: Any, doc: str) -> OpSpec:
    return OpSpec(name, OpKind.CALL, body=body, doc=doc)


OPS: Final[dict[str, OpSpec]] = {
    spec.name: spec
    for spec in (
        _call("route", ModelRef, "the worker actor serving a model (loading it if needed)"),
        OpSpec(
            "load_model",
            OpKind.STREAM,
            body=LoadModel,
            doc="load a model: progress events, END with its ModelInfo",
        ),
        _call("unload", ModelRef, "stop a model's worker (its shutdown saves run)"),
        _call("list_models", NoArgs, "every model the front knows"),
        _call("model_info", ModelRef, "one model"),
        _call("set_keep_alive", SetKeepAlive, "set a model's keep_alive; its ModelInfo"),
        _call("status", NoArgs, "models, workers, supervisors, cache tiers"),
        _call("counters", NoArgs, "the cache's counters"),
        _call("metrics", NoArgs, "every worker's counts and histograms, the cache's counters"),
        _call("evict_bytes", EvictBytes, "free at least n bytes of the cache; bytes freed"),
        _call("gc", NoArgs, "the cache's gc; a GcReport"),
    )
}
