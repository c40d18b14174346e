"""The front's table on disk, so a restarted front knows what it had loaded.

``model_sup``'s ``which_children`` says which workers run, not what they were
started with, nor which models were unloaded by ``keep_alive`` or given up.
The front writes its table to ``<runtime_dir>/front.models`` (msgpack,
written aside and renamed over, so a reader never sees half of it) after
every change; a front restarted by the root reads it back. The daemon
removes the file when it starts and when it stops: it describes one run.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Any, Final

import msgspec
import structlog

from llamad.front.table import ModelEntry, ModelTable
from llamad.front.wire import ModelState

__all__ = ["TABLE_FILE", "load_table", "save_table", "table_path"]

log = structlog.get_logger("llamad.front")

TABLE_FILE: Final = "front.models"


class SavedModel(msgspec.Struct, frozen=True):
    model_id: str
    spec: dict[str, Any]
    path: str
    n_ctx: int
    n_seq_max: int
    keep_alive_s: float | None
    configured: bool
    state: ModelState
    loaded_at: float | None = None
    restarts: int = 0
    last_exit: str | None = None
    error: str | None = None


_ENCODER: Final = msgspec.msgpack.Encoder()
_DECODER: Final = msgspec.msgpack.Decoder(list[SavedModel])


def table_path(runtime_dir: Path | str) -> Path:
    return Path(runtime_dir) / TABLE_FILE


def save_table(path: Path, table: ModelTable) -> None:
    rows = [
        SavedModel(
            model_id=e.model_id,
            spec=e.spec,
            path=e.path,
            n_ctx=e.n_ctx,
            n_seq_max=e.n_seq_max,
            keep_alive_s=e.keep_alive_s,
            configured=e.configured,
            state=e.state,
            loaded_at=e.loaded_at,
            restarts=e.restarts,
            last_exit=e.last_exit,
            error=e.error,
        )
        for e in table
    ]
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
        with os.fdopen(fd, "wb") as fh:
            fh.write(_ENCODER.encode(rows))
        os.replace(tmp, path)
    except OSError as exc:
        # Losing it costs only a restarted front's memory of runtime loads.
        log.warning("front.table_not_saved", path=str(path), error=str(exc))
        with contextlib.suppress(OSError):
            tmp.unlink()


def load_table(path: Path) -> list[ModelEntry]:
    """The entries a previous front of this daemon saved (none if no file)."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return []
    try:
        rows = _DECODER.decode(data)
    except msgspec.DecodeError as exc:
        log.warning("front.table_unreadable", path=str(path), error=str(exc))
        return []
    return [
        ModelEntry(
            model_id=r.model_id,
            spec=r.spec,
            path=r.path,
            n_ctx=r.n_ctx,
            n_seq_max=r.n_seq_max,
            keep_alive_s=r.keep_alive_s,
            configured=r.configured,
            state=r.state,
            loaded_at=r.loaded_at,
            restarts=r.restarts,
            last_exit=r.last_exit,
            error=r.error,
        )
        for r in rows
    ]
