"""What a model worker process is started with (SPEC M1, M15): :class:`WorkerSpec`.

A spec is built where the decision to load a model is made (``model_sup``,
a test) and travels to the worker process inside a supervisor
:class:`~llamad.supervisor.spec.ChildSpec` as plain msgpack (:meth:`to_wire`,
:meth:`from_wire`). Every field is validated at construction, on both sides,
and a bad one raises :class:`~llamad.errors.ConfigError` naming it
(``details["field"]``, e.g. ``context.kv_unified``): a worker with a bad spec
refuses to start instead of misbehaving under load.

The context and the core must agree on the sizes they share (``n_ctx``,
``n_batch``, ``n_seq_max``), and the context is always ``kv_unified``: any
sequence may then restore any row of the model's namespace. The thread
governor's policy (SPEC M14) must agree with the context's thread counts.
"""

from __future__ import annotations

import dataclasses
import enum
import math
import os
from collections.abc import Mapping, MutableMapping
from dataclasses import dataclass, field
from typing import Any, Final

from llamad.actors.curve import RemoteAccess
from llamad.actors.registry import check_name
from llamad.cache.policy import CachePolicy
from llamad.cache.settings import CacheSettings
from llamad.errors import ConfigError, LlamadError
from llamad.llama_ffi.options import ContextOptions, ModelOptions
from llamad.model.cache_view_config import CacheViewConfig
from llamad.model.config import MarkerPair, WorkerConfig
from llamad.model.threads import ThreadPolicy
from llamad.supervisor.spec import ChildSpec, Restart, Start

__all__ = [
    "DEFAULT_PARTS",
    "NT_THRESHOLD",
    "TILED_ENV",
    "TILED_MM_ENV",
    "WORKER_ENTRY",
    "WorkerSpec",
    "apply_numerics",
    "worker_actor_name",
    "worker_child_spec",
    "worker_env",
    "worker_template",
]

WORKER_ENTRY: Final = "llamad.model.worker_proc:run_worker"
"""The supervised entry point of every model worker."""
DEFAULT_PARTS: Final = "llamad.model.worker_parts:llama_parts"
"""The factory that loads the model and builds the real backend and cache view."""

_ACTOR_PREFIX: Final = "model."
_SHUTDOWN_MARGIN_S: Final = 10.0  # beyond the shutdown saves' cap: close, flush, exit


def worker_actor_name(model_id: str) -> str:
    """The actor name a model's worker serves (``model.<id>``): its own
    namespace in the registry, so no model id can take a system actor's name."""
    return check_name(_ACTOR_PREFIX + model_id, "model_id")


def _bad(field_name: str, message: str) -> ConfigError:
    return ConfigError(f"worker spec {field_name}: {message}", details={"field": field_name})


def _positive_number(field_name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise _bad(field_name, f"must be a finite number, got {value!r}")
    if value <= 0:
        raise _bad(field_name, f"must be > 0, got {value!r}")
    return float(value)


def _nested(prefix: str, build: Any, *args: Any, **kwargs: Any) -> Any:
    """``build(...)`` with its ConfigError re-raised under ``prefix.<field>``."""
    try:
        return build(*args, **kwargs)
    except ConfigError as exc:
        inner = exc.details.get("field") or exc.message.partition(":")[0].strip()
        raise ConfigError(
            f"{prefix}: {exc.message}", details={"field": f"{prefix}.{inner}"}
        ) from None
    except TypeError as exc:  # unknown or missing fields of a dataclass
        raise ConfigError(f"worker spec {prefix}: {exc}", details={"field": prefix}) from None


@dataclass(frozen=True)
class WorkerSpec:
    """One model worker: which model, which context, how it schedules and saves.

    ``model_id`` names the model to clients; the worker serves actor
    :func:`worker_actor_name` in the registry at ``registry_root`` (``None``:
    the cache's registry, else the runtime default). ``model`` and
    ``context`` are the binding's own options (``context.kv_unified`` must be
    true; ``context.n_threads`` is the decode thread count). ``worker`` is the
    core's configuration; its ``n_ctx``, ``n_batch`` and ``n_seq_max`` must
    equal the context's. ``cache`` says where cache-meta and the tiers are
    (``None``: no cache; every request runs cold and nothing is saved).

    ``decode_timeout_ms``: a decode that runs longer is stopped under way and
    its requests fail ``timeout``; a tick (one decode, its sampling and
    saves) still busy at 1.5 times it silences the heartbeat, so the
    supervisor kills and restarts the worker (SPEC M15). ``liveness_s``: how
    long the supervisor waits for a heartbeat before it does; a hung worker
    is killed between 1.5 x ``decode_timeout_ms`` and that plus
    ``liveness_s`` after its tick began. ``load_timeout_s``: how long loading may take before the
    start counts as failed. ``parts``: the ``"module:function"`` that builds
    the backend and cache view from this spec (tests name a stub factory).

    ``threads``: the thread governor's policy (SPEC M14,
    ``docs/internals/threads.md``); its ``max_threads`` must be the larger of
    the context's ``n_threads`` and ``n_threads_batch``. ``None`` (the
    default): :meth:`thread_policy` makes one where the worker runs, from the
    context's counts and the worker's own CPUs.

    ``cache_view``: which tiers the worker saves to and restores from, how it
    fingerprints the model, its lookup bounds and writer threads
    (:class:`~llamad.model.cache_view_config.CacheViewConfig`; default: save
    to ``ram``, restore from any tier). With a ``cache``, it is checked
    against the cache's tiers here (a save tier the cache lacks or holds 0
    bytes in is refused naming ``cache_view.save_tier``).

    ``remote``: when the daemon serves tcp, the worker listens there too
    (same host, an ephemeral port, the daemon's CURVE keys), so clients on
    other hosts can reach it (:class:`~llamad.actors.curve.RemoteAccess`).

    ``adapter_dirs``: the directories ``load_adapter`` may read from once
    symlinks and ``..`` are resolved (the daemon's ``[security].model_dirs``,
    SPEC D5); ``None`` (the default, a spec made outside a configuration):
    unchecked.

    ``deterministic``: the worker process turns ggml-cpu's tiled flash
    attention off (``GGML_CPU_FA_TILED=0``, and its tiled K-quant matmul,
    ``GGML_CPU_TILED_MM=0``; read once per process, before its first decode:
    :func:`apply_numerics`) and loads the model without repacked weights
    (:meth:`load_options`), so that a prompt's KV and logits do
    not depend on how it was chunked, what shared its batches or where its
    cells sit; prompt processing is slower (SPEC M19,
    ``bench/results/numerics-*.md``). Decodes are thread-count and placement
    invariant either way (llama.cpp patch 0003).
    """

    model_id: str
    model_path: str
    context: ContextOptions
    worker: WorkerConfig
    model: ModelOptions = field(default_factory=ModelOptions)
    cache: CacheSettings | None = None
    registry_root: str | None = None
    decode_timeout_ms: int = 30_000
    liveness_s: float = 5.0
    load_timeout_s: float = 120.0
    parts: str = DEFAULT_PARTS
    threads: ThreadPolicy | None = None
    cache_view: CacheViewConfig = field(default_factory=CacheViewConfig)
    remote: RemoteAccess | None = None
    adapter_dirs: tuple[str, ...] | None = None
    deterministic: bool = False

    def load_options(self) -> ModelOptions:
        """How the worker loads the model: :attr:`model`, but with the CPU
        backend's weight repacking off under ``deterministic``. A repacked
        multiply (Q4_0, IQ4_NL, the K-quants on AVX2) takes one kernel per
        group of 4 batch rows and another for the rest, so a row's result
        depends on where it sits in its batch: a Q4_K_M model's 16 concurrent
        greedy replies differed from their solo runs with it on. Tied to
        ``deterministic``, whose runtime switches are in the build identity,
        so rows computed either way never share a namespace."""
        if self.deterministic and self.model.repack:
            return dataclasses.replace(self.model, repack=False)
        return self.model

    def __post_init__(self) -> None:
        worker_actor_name(self.model_id)
        if not isinstance(self.deterministic, bool):
            raise _bad("deterministic", f"must be a boolean, not {self.deterministic!r}")
        path = self.model_path
        if isinstance(path, os.PathLike):
            path = os.fspath(path)
            object.__setattr__(self, "model_path", path)
        if not isinstance(path, str) or not path.startswith("/") or "\0" in path:
            raise _bad("model_path", f"must be an absolute path, got {path!r}")
        if not isinstance(self.model, ModelOptions):
            raise _bad("model", "must be a ModelOptions")
        if not isinstance(self.context, ContextOptions):
            raise _bad("context", "must be a ContextOptions")
        if not isinstance(self.worker, WorkerConfig):
            raise _bad("worker", "must be a WorkerConfig")
        if self.context.kv_unified is not True:
            raise _bad("context.kv_unified", "must be true: any sequence may restore any row")
        for name in ("n_ctx", "n_batch", "n_seq_max"):
            theirs, ours = getattr(self.context, name), getattr(self.worker, name)
            if theirs != ours:
                raise _bad(f"worker.{name}", f"is {ours} but the context's {name} is {theirs}")
        if self.cache is not None and not isinstance(self.cache, CacheSettings):
            raise _bad("cache", "must be CacheSettings or None")
        if not isinstance(self.cache_view, CacheViewConfig):
            raise _bad("cache_view", "must be a CacheViewConfig")
        if self.remote is not None and not isinstance(self.remote, RemoteAccess):
            raise _bad("remote", "must be a RemoteAccess or None")
        if self.adapter_dirs is not None:
            dirs = self.adapter_dirs
            if isinstance(dirs, str) or not all(
                isinstance(d, str) and d.startswith("/") and "\0" not in d for d in dirs
            ):
                raise _bad("adapter_dirs", f"must be absolute paths or None, got {dirs!r}")
            object.__setattr__(self, "adapter_dirs", tuple(dirs))
        if self.cache is not None:
            quotas = {t.kind: t.quota for t in self.cache.tiers}
            _nested("cache_view", self.cache_view.check_against, quotas)
        if self.threads is not None:
            if not isinstance(self.threads, ThreadPolicy):
                raise _bad("threads", "must be a ThreadPolicy or None")
            most = self.max_threads
            if self.threads.max_threads != most:
                raise _bad(
                    "threads.max_threads",
                    f"is {self.threads.max_threads} but the context computes on at most {most} "
                    "threads (the larger of n_threads and n_threads_batch)",
                )
        root = self.registry_root
        if isinstance(root, os.PathLike):
            root = os.fspath(root)
            object.__setattr__(self, "registry_root", root)
        if root is not None and (not isinstance(root, str) or not root.startswith("/")):
            raise _bad("registry_root", f"must be an absolute path or None, got {root!r}")
        timeout = self.decode_timeout_ms
        if isinstance(timeout, bool) or not isinstance(timeout, int) or timeout < 1:
            raise _bad("decode_timeout_ms", f"must be an integer >= 1, got {timeout!r}")
        object.__setattr__(self, "liveness_s", _positive_number("liveness_s", self.liveness_s))
        object.__setattr__(
            self, "load_timeout_s", _positive_number("load_timeout_s", self.load_timeout_s)
        )
        try:
            Start(self.parts)
        except LlamadError:
            raise _bad(
                "parts", f"must look like 'package.module:function', got {self.parts!r}"
            ) from None

    @property
    def actor_name(self) -> str:
        return worker_actor_name(self.model_id)

    @property
    def registry(self) -> str | None:
        """The registry root the worker's actor registers in."""
        if self.registry_root is not None:
            return self.registry_root
        if self.cache is not None and self.cache.registry_root is not None:
            return str(self.cache.registry_root)
        return None

    @property
    def decode_timeout_s(self) -> float:
        return self.decode_timeout_ms / 1000.0

    @property
    def max_threads(self) -> int:
        """The most threads a decode of this worker runs on (the context's
        larger count; the governor caps each count by its own value)."""
        return max(self.context.n_threads, self.context.n_threads_batch)

    def thread_policy(self) -> ThreadPolicy:
        """The governor's policy: :attr:`threads`, or the default for this
        context on the CPUs the calling process may use (call it in the worker)."""
        if self.threads is not None:
            return self.threads
        return ThreadPolicy(max_threads=self.max_threads)

    # -- wire (Start kwargs must be msgpack-able) ----------------------------------

    def to_wire(self) -> dict[str, Any]:
        return {
            "model_id": self.model_id,
            "model_path": self.model_path,
            "model": _options_to_wire(self.model),
            "context": _options_to_wire(self.context),
            "worker": _worker_to_wire(self.worker),
            "cache": None if self.cache is None else self.cache.to_wire(),
            "registry_root": self.registry_root,
            "decode_timeout_ms": self.decode_timeout_ms,
            "liveness_s": self.liveness_s,
            "load_timeout_s": self.load_timeout_s,
            "parts": self.parts,
            "threads": None if self.threads is None else dataclasses.asdict(self.threads),
            "cache_view": _cache_view_to_wire(self.cache_view),
            "remote": None if self.remote is None else self.remote.to_wire(),
            "adapter_dirs": None if self.adapter_dirs is None else list(self.adapter_dirs),
            "deterministic": self.deterministic,
        }

    @classmethod
    def from_wire(cls, data: object) -> WorkerSpec:
        """Rebuild (and validate) a spec sent by :meth:`to_wire`."""
        if not isinstance(data, Mapping):
            raise _bad("spec", "must be a mapping")
        known = {f.name for f in dataclasses.fields(cls)}
        for key in data:
            if key not in known:
                raise _bad(str(key), "unknown field")
        for key in ("model_id", "model_path", "context", "worker"):
            if key not in data:
                raise _bad(key, "missing")
        fields_: dict[str, Any] = {k: v for k, v in data.items() if k in known}
        fields_["model"] = _nested("model", _options_from_wire, ModelOptions, data.get("model", {}))
        fields_["context"] = _nested("context", _options_from_wire, ContextOptions, data["context"])
        fields_["worker"] = _nested("worker", _worker_from_wire, data["worker"])
        if data.get("cache") is not None:
            fields_["cache"] = _nested("cache", CacheSettings.from_wire, data["cache"])
        if data.get("threads") is not None:
            fields_["threads"] = _policy_from_wire(data["threads"])
        if "cache_view" in data:
            fields_["cache_view"] = _nested("cache_view", _cache_view_from_wire, data["cache_view"])
        if data.get("remote") is not None:
            fields_["remote"] = _nested("remote", RemoteAccess.from_wire, data["remote"])
        return cls(**fields_)


def _plain(value: Any) -> Any:
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, tuple):
        return [_plain(v) for v in value]
    return value


def _options_to_wire(options: ModelOptions | ContextOptions) -> dict[str, Any]:
    return {f.name: _plain(getattr(options, f.name)) for f in dataclasses.fields(options)}


def _options_from_wire(cls: type[Any], data: object) -> Any:
    if not isinstance(data, Mapping):
        raise ConfigError("must be a mapping")
    known = {f.name for f in dataclasses.fields(cls)}
    for key in data:
        if key not in known:
            raise ConfigError(f"{key}: unknown field", details={"field": str(key)})
    return cls(**data)


def _policy_from_wire(data: object) -> ThreadPolicy:
    # ThreadPolicy's own errors already name ``threads.<field>``.
    if not isinstance(data, Mapping):
        raise _bad("threads", "must be a mapping")
    known = {f.name for f in dataclasses.fields(ThreadPolicy)}
    for key in data:
        if key not in known:
            raise _bad(f"threads.{key}", "unknown field")
    if "max_threads" not in data:
        raise _bad("threads.max_threads", "missing")
    return ThreadPolicy(**data)


def _cache_view_to_wire(config: CacheViewConfig) -> dict[str, Any]:
    out = {f.name: _plain(getattr(config, f.name)) for f in dataclasses.fields(config)}
    out["restore_tiers"] = sorted(t.value for t in config.restore_tiers)
    return out


def _cache_view_from_wire(data: object) -> CacheViewConfig:
    # CacheViewConfig takes tiers and modes by value and names a bad field itself.
    if not isinstance(data, Mapping):
        raise ConfigError("must be a mapping")
    known = {f.name for f in dataclasses.fields(CacheViewConfig)}
    for key in data:
        if key not in known:
            raise ConfigError(f"{key}: unknown field", details={"field": str(key)})
    return CacheViewConfig(**data)


def _worker_to_wire(config: WorkerConfig) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for f in dataclasses.fields(config):
        value = getattr(config, f.name)
        if isinstance(value, CachePolicy):
            value = dataclasses.asdict(value)
        elif isinstance(value, MarkerPair):
            value = {"open": value.open, "close": value.close}
        out[f.name] = value
    return out


def _worker_from_wire(data: object) -> WorkerConfig:
    if not isinstance(data, Mapping):
        raise ConfigError("must be a mapping")
    known = {f.name for f in dataclasses.fields(WorkerConfig)}
    values = dict(data)
    for key in values:
        if key not in known:
            raise ConfigError(f"{key}: unknown field", details={"field": str(key)})
    if "policy" in values:
        values["policy"] = _nested("policy", CachePolicy.from_mapping, values["policy"] or {})
    for name in ("thinking", "tool_call"):
        marker = values.get(name)
        if isinstance(marker, Mapping):
            values[name] = MarkerPair(**marker)
    return WorkerConfig(**values)


def worker_template(
    *,
    liveness_s: float = 5.0,
    shutdown_s: float = 30.0 + _SHUTDOWN_MARGIN_S,
    load_timeout_s: float = 120.0,
    restart: Restart = Restart.PERMANENT,
) -> ChildSpec:
    """``model_sup``'s template child (``simple_one_for_one``): each
    ``start_child([spec.to_wire()])`` runs one worker. The template's timings
    apply to every worker started from it, so give the largest any model needs."""
    return ChildSpec(
        id="model-worker",
        start=Start(WORKER_ENTRY),
        restart=restart,
        shutdown=shutdown_s,
        liveness_timeout=liveness_s,
        start_timeout=load_timeout_s,
        env=worker_env(),
    )


NT_THRESHOLD: Final = 0x40000
"""The copy size from which a worker's ``memcpy`` stores bypass the cache (256 KiB).

A restore's ``llama_state_seq_set_data`` copies the row into the KV one
layer's K or V at a time (786 KB per copy at 2,048 tokens of the default
model). glibc stores through the cache below its non-temporal threshold,
which it sets from the last-level cache's size (99 MB on a 260 MB-L3
Xeon), so every destination line was first read from memory and the copy
took ~1.6x as long: 6.4-7.0 ms for a 47 MB row in the
daemon, 3.9-4.3 ms with this threshold (``docs/internals/model-worker.md``,
"Copies that bypass the cache"). Below it (a 196 KB logits row, a
decode's tensors) nothing changes."""

_TUNABLES_ENV: Final = "GLIBC_TUNABLES"
_NT_TUNABLE: Final = "glibc.cpu.x86_non_temporal_threshold"


def worker_env(environ: Mapping[str, str] = os.environ) -> dict[str, str]:
    """What a worker's environment adds to its supervisor's: glibc's
    non-temporal threshold at :data:`NT_THRESHOLD`, after any tunables the
    operator set (``GLIBC_TUNABLES``, read once by the loader when the
    process starts). An operator's own threshold is left alone. Other C
    libraries ignore the variable."""
    tunables = environ.get(_TUNABLES_ENV, "")
    named = {item.split("=", 1)[0] for item in tunables.split(":") if item}
    if _NT_TUNABLE in named:
        return {}
    ours = f"{_NT_TUNABLE}={NT_THRESHOLD:#x}"
    return {_TUNABLES_ENV: f"{tunables}:{ours}" if tunables else ours}


TILED_ENV: Final = "GGML_CPU_FA_TILED"
"""ggml-cpu's switch for its tiled flash attention (llamad's llama.cpp patch 0003)."""

TILED_MM_ENV: Final = "GGML_CPU_TILED_MM"
"""ggml-cpu's switch for its tiled K-quant matrix multiply, taken from 8 rows up."""


def apply_numerics(spec: WorkerSpec, environ: MutableMapping[str, str] = os.environ) -> None:
    """Set what ``spec.deterministic`` asks of the library in this process's
    environment. Call it before the process's first decode: ggml-cpu reads the
    switch once, and the cache namespace records it (``llama_ffi.build_info``)."""
    if spec.deterministic:
        environ[TILED_ENV] = "0"
        # K-quant weights take another kernel from 8 rows up; one kernel for
        # every batch (not measured on the default model, which is Q4_1).
        environ[TILED_MM_ENV] = "0"


def worker_child_spec(
    spec: WorkerSpec,
    *,
    child_id: str | None = None,
    restart: Restart = Restart.PERMANENT,
) -> ChildSpec:
    """The supervisor child that runs ``spec``'s worker.

    Liveness is the heartbeat window (:attr:`WorkerSpec.liveness_s`): the
    worker stops beating when a tick outlives ``decode_timeout_ms``. The
    shutdown allowance covers the shutdown saves (``evict_save_timeout_ms``)
    plus closing; the start allowance is the model's load time.

    Under ``model_sup`` (``simple_one_for_one``) the same fields make the
    template, whose start carries no argument:
    ``start_child([spec.to_wire()], child_id=spec.actor_name)`` appends the
    spec (see :func:`worker_template`).
    """
    saves_s = spec.worker.policy.evict_save_timeout_ms / 1000.0
    return ChildSpec(
        id=child_id or spec.actor_name,
        start=Start(WORKER_ENTRY, (spec.to_wire(),)),
        restart=restart,
        shutdown=saves_s + _SHUTDOWN_MARGIN_S,
        liveness_timeout=spec.liveness_s,
        start_timeout=spec.load_timeout_s,
        env=worker_env(),
    )
