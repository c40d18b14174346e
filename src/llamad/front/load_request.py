"""``load_model``'s path and options into a worker spec, by the config's own rules (SPEC D5).

A run-time load is checked exactly as a ``[models.<id>]`` table of the config
file would be (:func:`llamad.config.reader.read_table`, then every part built
by :func:`llamad.config.convert.conversion_problems`), so one option means the
same thing, and is refused the same way (naming ``models.<id>.<key>``), in the
file and over the wire. In order, each refusal typed:

1. the options as a table: :class:`~llamad.errors.ConfigError` listing every
   problem by key (unknown key, wrong type, out of range);
2. the path, after resolving every symlink and ``..``, inside
   ``[security].model_dirs``, else :class:`~llamad.errors.PathNotAllowed`
   (before anything says whether the file exists);
3. the file exists and is a regular file, else
   :class:`~llamad.llama_ffi.errors.ModelFileError`; a complete GGUF, else
   ``NotGGUF`` / ``TruncatedGGUF`` (read by ggml's header reader, no tensor
   data);
4. the parts (context, worker config, cache view, thread policy, spec) and
   the rules between keys: ``ConfigError`` naming the key;
5. timings the daemon's worker template cannot honour (its ``liveness_s``,
   ``load_timeout_s`` and shutdown allowance are fixed when the daemon
   starts): ``ConfigError`` naming the key.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec

from llamad.config import DEFAULT_MODEL_PATH, LlamadConfig, ModelConfig, resolve_model_path
from llamad.config.convert import conversion_problems
from llamad.config.problems import Problems
from llamad.config.reader import read_table
from llamad.errors import ConfigError, ModelNotFound
from llamad.llama_ffi.errors import ModelFileError
from llamad.llama_ffi.gguf_check import check_gguf
from llamad.model.worker_spec import WorkerSpec
from llamad.paths import contained_model_path, default_model_path

__all__ = ["LoadRequest", "TemplateLimits", "load_request"]


@dataclass(frozen=True)
class TemplateLimits:
    """What the daemon's worker template allows every worker (seconds)."""

    liveness_s: float
    load_timeout_s: float
    shutdown_s: float


@dataclass(frozen=True)
class LoadRequest:
    """A checked run-time load: the model's table, its worker spec."""

    model: ModelConfig
    spec: WorkerSpec


def _model_path(path: str, config: LlamadConfig, field: str) -> Path:
    text = str(default_model_path()) if path == DEFAULT_MODEL_PATH else path
    # Containment first (PathNotAllowed), before anything says whether the file exists.
    contained_model_path(text, config.model_dirs, field)
    try:
        return resolve_model_path(text, config.model_dirs, field)
    except ConfigError as exc:  # missing, or not a regular file
        raise ModelFileError(exc.message, details={"path": text, "field": field}) from None


def load_request(
    config: LlamadConfig,
    model_id: str,
    path: str | None,
    options: Mapping[str, Any],
    limits: TemplateLimits | None = None,
) -> LoadRequest:
    """Check ``load_model(model_id, path, **options)``; raise the first refusal
    (module doc). ``path`` ``None``: the configured model's table (its path and
    keys), with ``options`` over it."""
    key = ("models", model_id)
    problems = Problems()
    if "path" in options:
        problems.add((*key, "path"), "pass the path as load_model's path, not as an option")
    raw = {k: v for k, v in options.items() if k != "path"}
    if path is None:
        configured = config.models.get(model_id)
        if configured is None:
            raise ModelNotFound(
                f"no model {model_id!r} in the configuration: load_model needs a path",
                details={"model_id": model_id},
            )
        # The configured table (the keys it sets), with the options over it.
        written = _written(
            msgspec.to_builtins(configured),
            msgspec.to_builtins(ModelConfig(path=configured.path)),
        )
        raw = {**written, **raw}
        path = configured.path
    raw["path"] = path
    model = read_table(ModelConfig, raw, key, problems)
    problems.raise_if_any(f"load_model {model_id!r}")

    field = f"models.{model_id}.path"
    real = _model_path(model.path, config, field)
    check_gguf(real)
    model = msgspec.structs.replace(model, path=str(real))
    with_model = msgspec.structs.replace(config, models={**config.models, model_id: model})
    conversion_problems(with_model, problems, [model_id])
    problems.raise_if_any(f"load_model {model_id!r}")
    spec = with_model.worker_spec(model_id)
    if limits is not None:
        _check_limits(model_id, spec, limits)
    return LoadRequest(model, spec)


def _written(values: dict[str, Any], defaults: dict[str, Any]) -> dict[str, Any]:
    """The keys of a table (as read back from its struct) that differ from the
    defaults: what its file set, in the file's terms."""
    out: dict[str, Any] = {}
    for key, value in values.items():
        default = defaults.get(key)
        if isinstance(value, dict) and isinstance(default, dict):
            nested = _written(value, default)
            if nested:
                out[key] = nested
        elif value != default:
            out[key] = value
    return out


def _check_limits(model_id: str, spec: WorkerSpec, limits: TemplateLimits) -> None:
    problems = Problems()
    key = ("models", model_id)
    if spec.liveness_s > limits.liveness_s:
        problems.add(
            (*key, "liveness_s"),
            f"the daemon's workers run with a {limits.liveness_s:g}s heartbeat window "
            "(the largest liveness_s in its config); this one asks for more",
        )
    if spec.load_timeout_s > limits.load_timeout_s:
        problems.add(
            (*key, "load_timeout_s"),
            f"the daemon's workers have {limits.load_timeout_s:g}s to load "
            "(the largest load_timeout_s in its config); this one asks for more",
        )
    saves_s = spec.worker.policy.evict_save_timeout_ms / 1000.0
    if saves_s > limits.shutdown_s:
        problems.add(
            (*key, "cache", "policy", "evict_save_timeout_ms"),
            f"the daemon's workers have {limits.shutdown_s:g}s for their shutdown saves; "
            "this one asks for more",
        )
    problems.raise_if_any(f"load_model {model_id!r}")
