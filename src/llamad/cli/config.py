"""``llamad config check FILE`` and ``llamad config example``, as functions the CLI calls.

``check`` loads the file exactly as the daemon would (environment overrides
included, every model file's header read) and starts nothing: exit status 0
and a summary of what would run on stdout, or 1 and every problem on stderr.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from typing import TextIO

from llamad.config.load import load_config
from llamad.config.reference import example as _example
from llamad.config.schema import LlamadConfig
from llamad.config.units import format_duration, format_size
from llamad.errors import ConfigError

__all__ = ["check", "example", "summary"]


def example() -> str:
    """The commented example config (``llamad config example``)."""
    return _example()


def check(
    path: str | os.PathLike[str] | None,
    *,
    env: Mapping[str, str] | None = None,
    out: TextIO | None = None,
    err: TextIO | None = None,
) -> int:
    """Validate ``path`` without starting anything; the exit status."""
    out = out if out is not None else sys.stdout
    err = err if err is not None else sys.stderr
    try:
        config = load_config(path, env=env)
    except ConfigError as exc:
        err.write(exc.message + "\n")
        return 1
    out.write(summary(config))
    return 0


def summary(config: LlamadConfig) -> str:
    """What the daemon would run with ``config``, one line per part."""
    d, c, s = config.daemon, config.cache, config.security
    cores = d.threads.cores
    lines = [
        f"configuration ok: {config.source or 'no config file (defaults)'}",
    ]
    if config.overrides:
        lines.append(f"  environment overrides: {', '.join(config.overrides)}")
    lines += [
        f"  endpoint     {config.endpoint}",
        f"  runtime_dir  {config.runtime_dir}",
        f"  state_dir    {config.state_dir}",
        f"  logs         {d.log_format}, {d.log_level}",
        f"  threads      {'every CPU' if cores is None else cores} shared by the workers",
    ]
    tiers = []
    for name, quota, root in (
        ("ram", c.ram.quota, None),
        ("ram_file", c.ram_file.quota, c.ram_file.root),
        ("disk", c.disk.quota, c.disk.root),
    ):
        if quota:
            tiers.append(f"{name} {format_size(quota)}" + (f" in {root}" if root else ""))
    lines.append(f"  cache        {'; '.join(tiers)} (instance {c.instance!r})")
    lines.append(f"  model_dirs   {', '.join(s.model_dirs or ()) or 'none'}")
    if not config.models:
        lines.append("  models       none at start")
    for model_id, m in config.models.items():
        idle = "never" if m.keep_alive is None else format_duration(m.keep_alive)
        lines.append(
            f"  model {model_id}: {m.path} (n_ctx {m.n_ctx}, n_seq_max {m.n_seq_max}, "
            f"saves to {m.cache.save_tier}, keep_alive {idle})"
        )
    return "\n".join(lines) + "\n"
