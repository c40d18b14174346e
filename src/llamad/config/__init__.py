"""llamad's configuration: one TOML file, ``LLAMAD_*`` overrides, validated as a whole.

::

    from llamad.config import load_config

    config = load_config("/etc/llamad/llamad.toml")   # or None: defaults
    config.endpoint, config.runtime_dir, config.state_dir, config.registry_root
    config.cache_settings()          # CacheSettings for cache-meta
    config.worker_spec("smollm2")    # WorkerSpec for one model worker
    config.models["smollm2"].keep_alive

A bad configuration raises one :class:`~llamad.errors.ConfigError` listing
every problem, each naming its key (``models.smol.n_ctx``). The schema and
every key are in ``docs/internals/config.md``; ``llamad config example``
prints a commented file (:func:`llamad.config.cli.example`).

Importing this package never loads libllama; building a worker's spec (and
:func:`load_config`, which builds every part once) does.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from llamad._lazy import lazy_face

if TYPE_CHECKING:
    from llamad.config.client import CONFIG_ENV, client_curve, client_endpoint
    from llamad.config.load import load_config
    from llamad.config.model_schema import DEFAULT_MODEL_PATH, ModelConfig
    from llamad.config.problems import Problem
    from llamad.config.schema import DEFAULT_MODEL_ID, LlamadConfig
    from llamad.config.security import check_endpoint, resolve_model_path
    from llamad.config.units import parse_duration, parse_size
    from llamad.errors import ConfigError

__getattr__, __dir__ = lazy_face(
    __name__,
    {
        "llamad.config.client": (
            "CONFIG_ENV",
            "client_curve",
            "client_endpoint",
        ),
        "llamad.config.load": ("load_config",),
        "llamad.config.model_schema": (
            "DEFAULT_MODEL_PATH",
            "ModelConfig",
        ),
        "llamad.config.problems": ("Problem",),
        "llamad.config.schema": (
            "DEFAULT_MODEL_ID",
            "LlamadConfig",
        ),
        "llamad.config.security": (
            "check_endpoint",
            "resolve_model_path",
        ),
        "llamad.config.units": (
            "parse_duration",
            "parse_size",
        ),
        "llamad.errors": ("ConfigError",),
    },
)

__all__ = [
    "CONFIG_ENV",
    "DEFAULT_MODEL_ID",
    "DEFAULT_MODEL_PATH",
    "ConfigError",
    "LlamadConfig",
    "ModelConfig",
    "Problem",
    "check_endpoint",
    "client_curve",
    "client_endpoint",
    "load_config",
    "parse_duration",
    "parse_size",
    "resolve_model_path",
]
