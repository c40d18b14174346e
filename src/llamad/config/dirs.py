"""Where things go when the configuration does not say: computed, never created.

The runtime directory follows :func:`llamad.actors.registry.runtime_dir`
(the directory every actor registry defaults to), so a daemon configured
with defaults and a process that only knows the defaults agree. Nothing
here touches the filesystem: the daemon creates directories when it starts.
"""

from __future__ import annotations

import os
import posixpath
from collections.abc import Mapping
from typing import Final

from llamad.errors import LlamadError
from llamad.paths import cache_root, default_model_path

__all__ = [
    "ENDPOINT_NAME",
    "default_endpoint",
    "default_model_dirs",
    "default_ram_file_root",
    "default_runtime_dir",
    "default_state_dir",
]

ENDPOINT_NAME: Final = "llamad.sock"


def default_runtime_dir(env: Mapping[str, str]) -> str:
    """``$LLAMAD_RUNTIME_DIR``, else ``$XDG_RUNTIME_DIR/llamad``, else ``/tmp/llamad-<uid>``."""
    if env.get("LLAMAD_RUNTIME_DIR"):
        return posixpath.normpath(os.path.expanduser(env["LLAMAD_RUNTIME_DIR"]))
    if env.get("XDG_RUNTIME_DIR"):
        return posixpath.join(env["XDG_RUNTIME_DIR"], "llamad")
    return f"/tmp/llamad-{os.getuid()}"


def default_state_dir(env: Mapping[str, str]) -> str:
    """``$STATE_DIRECTORY`` (systemd's StateDirectory=, the first when it lists
    several), else ``$XDG_STATE_HOME/llamad``, else ``~/.local/state/llamad``."""
    if env.get("STATE_DIRECTORY"):
        return env["STATE_DIRECTORY"].split(":")[0]
    if env.get("XDG_STATE_HOME"):
        return posixpath.join(env["XDG_STATE_HOME"], "llamad")
    home = env.get("HOME") or os.path.expanduser("~")
    return posixpath.join(home, ".local", "state", "llamad")


def default_ram_file_root(instance: str) -> str:
    """``[cache.ram_file] root`` when unset: beside the ``ram`` segments on
    /dev/shm (one filesystem, so moves between them are links), a directory
    per user and per cache instance."""
    return f"/dev/shm/llamad-{os.getuid()}/{instance}"


def default_endpoint(runtime_dir: str) -> str:
    """The ipc endpoint in ``runtime_dir`` (SPEC D5: ipc in a 0700 directory)."""
    return "ipc://" + posixpath.join(runtime_dir, ENDPOINT_NAME)


def default_model_dirs() -> tuple[str, ...]:
    """``<llamad cache>/models`` (where ``make setup`` puts the default model)
    and the default model's own directory (``LLAMAD_DEFAULT_MODEL`` may put it
    elsewhere)."""
    models = cache_root() / "models"
    dirs = [models]
    try:
        parent = default_model_path().parent
    except LlamadError:  # not installed: a model naming it is refused on its own
        parent = models
    if not parent.is_relative_to(models):
        dirs.append(parent)
    return tuple(posixpath.normpath(d) for d in dirs)
