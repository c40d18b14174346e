"""``LLAMAD_*`` environment variables override any key of the file.

The scheme: ``LLAMAD_`` then the key path, its segments joined by a double
underscore, in any case::

    LLAMAD_DAEMON__ENDPOINT=ipc:///run/llamad/llamad.sock   daemon.endpoint
    LLAMAD_DAEMON__THREADS__CORES=4                          daemon.threads.cores
    LLAMAD_CACHE__DISK__QUOTA=10GiB                          cache.disk.quota
    LLAMAD_MODELS__SMOLLM2__N_CTX=8192                       models.smollm2.n_ctx
    LLAMAD_SECURITY__MODEL_DIRS='["/srv/models", "/opt/m"]'  security.model_dirs

Only names with a ``__`` after the prefix are overrides, so llamad's other
variables (``LLAMAD_RUNTIME_DIR``, ``LLAMAD_LOG_LEVEL``, ...) never are. A
segment after ``MODELS`` names a model: it matches a model of the file whose
id, upper-cased with every character other than a letter or digit made
``_``, equals it (``LLAMA_3_8B`` matches ``llama-3.8b``); with no match it
adds a model of that id in lower case (which then needs a ``path``).

A value is read as a TOML value when it is one (``8``, ``true``, ``1.5``,
``"x"``, ``["/a", "/b"]``, ``{quota = "1GiB"}``), else as a plain string
(``info``, ``/srv/models/a.gguf``, ``10m``), then checked by the same rules
as the file's values; an empty value is ignored (unset). Overrides apply in
name order, so ``LLAMAD_CACHE__POLICY={...}`` is set before
``LLAMAD_CACHE__POLICY__MIN_TOKENS`` refines it. Unknown keys are refused by
the schema like the file's, naming the variable.
"""

from __future__ import annotations

import re
import tomllib
from collections.abc import Mapping
from typing import Any, Final

from llamad.config.problems import KeyPath, Problem, Problems

__all__ = ["PREFIX", "SEPARATOR", "apply_env", "env_name", "parse_env_value"]

PREFIX: Final = "LLAMAD_"
SEPARATOR: Final = "__"
_MODELS: Final = "models"


def _normal(segment: str) -> str:
    return re.sub(r"[^A-Z0-9]", "_", segment.upper())


def env_name(path: KeyPath) -> str:
    """The variable that overrides the key at ``path`` (``models.smol.n_ctx``)."""
    return PREFIX + SEPARATOR.join(_normal(p) for p in path)


def parse_env_value(text: str) -> Any:
    """``text`` as a TOML value if it is one, else the string itself."""
    try:
        doc = tomllib.loads(f"v = {text}")
    except tomllib.TOMLDecodeError:
        return text
    if set(doc) != {"v"}:  # a value with a newline and another key after it
        return text
    return doc["v"]


def _key_path(segments: list[str], raw: Mapping[str, Any]) -> tuple[KeyPath, str | None]:
    """The key path the segments name, or a reason they name none."""
    path = [s.lower() for s in segments]
    if path[0] == _MODELS and len(path) > 1:
        models = raw.get(_MODELS)
        ids = list(models) if isinstance(models, dict) else []
        matches = [i for i in ids if _normal(i) == segments[1].upper()]
        if len(matches) > 1:
            return (), f"matches models {', '.join(sorted(matches))}: rename one of them"
        if matches:
            path[1] = matches[0]
    return tuple(path), None


def apply_env(raw: dict[str, Any], env: Mapping[str, str], problems: Problems) -> tuple[str, ...]:
    """Apply every override of ``env`` to ``raw`` (in place); record in
    ``problems.origins`` which variable set which key. Returns the names applied."""
    applied: list[str] = []
    for name in sorted(env):
        rest = name[len(PREFIX) :] if name.startswith(PREFIX) else ""
        if SEPARATOR not in rest or env[name] == "":
            continue
        segments = rest.split(SEPARATOR)
        if any(not s for s in segments):
            problems.items.append(
                Problem((), "not an override name (LLAMAD_<SECTION>__<KEY>[__<KEY>...])", name)
            )
            continue
        path, refused = _key_path(segments, raw)
        if refused is not None:
            problems.items.append(Problem((), refused, name))
            continue
        models = raw.get(_MODELS)
        if (
            path[0] == _MODELS
            and len(path) > 2
            and not (isinstance(models, dict) and path[1] in models)
        ):
            # A model this variable brings into being: its problems name it.
            problems.origins.setdefault(path[:2], name)
        table = raw
        for depth, segment in enumerate(path[:-1]):
            inner = table.setdefault(segment, {})
            if not isinstance(inner, dict):
                problems.items.append(Problem(path[: depth + 1], "is not a table", name))
                break
            table = inner
        else:
            table[path[-1]] = parse_env_value(env[name])
            problems.origins[path] = name
            applied.append(name)
    return tuple(applied)
