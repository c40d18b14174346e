"""Helpers of the config tests: a tiny GGUF, TOML text from dicts, problems by key."""

from __future__ import annotations

import copy
import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gguf
import numpy as np
import pytest

from llamad.config import ConfigError, LlamadConfig, load_config


def write_gguf(path: Path) -> Path:
    """A small but complete GGUF file (config checks read its header, never load it)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    w = gguf.GGUFWriter(str(path), arch="llama")
    w.add_string("general.name", "tiny")
    w.add_tensor("a", np.arange(64, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def _value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, str):
        return json.dumps(v)
    if isinstance(v, list | tuple):
        return "[" + ", ".join(_value(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{" + ", ".join(f"{json.dumps(k)} = {_value(x)}" for k, x in v.items()) + "}"
    return repr(v)


def toml_text(data: Mapping[str, Any], prefix: tuple[str, ...] = ()) -> str:
    """``data`` as TOML: values first, then one ``[a.b]`` header per nested table."""
    lines: list[str] = []
    for key, value in data.items():
        if not isinstance(value, dict):
            lines.append(f"{json.dumps(key)} = {_value(value)}")
    for key, value in data.items():
        if isinstance(value, dict):
            path = (*prefix, key)
            lines.append("")
            lines.append("[" + ".".join(json.dumps(p) for p in path) + "]")
            lines.append(toml_text(value, path))
    return "\n".join(lines)


def set_key(data: dict[str, Any], path: tuple[str, ...], value: Any) -> dict[str, Any]:
    """``data`` with ``path`` set to ``value`` (tables created as needed)."""
    table = data
    for part in path[:-1]:
        table = table.setdefault(part, {})
    table[path[-1]] = value
    return data


def drop_key(data: dict[str, Any], path: tuple[str, ...]) -> dict[str, Any]:
    table = data
    for part in path[:-1]:
        table = table[part]
    del table[path[-1]]
    return data


def write_config(directory: Path, data: Mapping[str, Any] | str) -> Path:
    path = directory / "llamad.toml"
    path.write_text(data if isinstance(data, str) else toml_text(data))
    return path


def problems_of(exc: ConfigError) -> dict[str, str]:
    """Every problem of a refused config by key (``"models.smol.n_ctx"``)."""
    return {e["key"]: e["problem"] for e in exc.details["errors"]}


def refused(
    directory: Path, data: Mapping[str, Any] | str, env: Mapping[str, str]
) -> dict[str, str]:
    """The problems of a config that must be refused."""
    with pytest.raises(ConfigError) as info:
        load_config(write_config(directory, data), env=env)
    return problems_of(info.value)


def loaded(directory: Path, data: Mapping[str, Any] | str, env: Mapping[str, str]) -> LlamadConfig:
    return load_config(write_config(directory, data), env=env)


@dataclass
class Workspace:
    """A directory, an isolated environment and a config that loads (``base``)."""

    dir: Path
    env: dict[str, str]
    base: dict[str, Any]
    models_dir: Path
    tiny: Path

    def data(self, values: Mapping[tuple[str, ...], Any] | None = None) -> dict[str, Any]:
        """A copy of ``base`` with ``values`` set (key path -> value)."""
        data = copy.deepcopy(self.base)
        for path, value in (values or {}).items():
            set_key(data, path, value)
        return data

    def refused(self, data: Mapping[str, Any] | str) -> dict[str, str]:
        return refused(self.dir, data, self.env)

    def loaded(self, data: Mapping[str, Any] | str) -> LlamadConfig:
        return loaded(self.dir, data, self.env)
