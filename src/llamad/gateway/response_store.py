"""Stored responses of ``POST /v1/responses``: bounded, on disk, oldest out first.

A response asked with ``store`` (OpenAI's default) is kept so that a later
request can name it as ``previous_response_id`` and ``GET`` /
``DELETE /v1/responses/{id}`` can find it. Each is one JSON file in
``<state_dir>/gateway/responses/``, named ``<sequence>-<id>.json`` so that
the names sort oldest first; the file is written under a temporary name and
renamed, so a crash leaves either the whole record or none. At start the
directory is read back (only names, sizes and the order: a record's body is
read when it is asked for), so responses survive a gateway or daemon
restart.

Bounds: at most ``max_count`` records and ``max_bytes`` bytes of them; a
store that would pass either drops the oldest records first. One record
larger than ``max_bytes`` alone is not stored (the request still succeeds;
it simply cannot be continued). Files whose names do not parse, and
temporary files a crash left, are removed at start.

The store is used from one event loop; its file operations are small
(a record is the conversation's messages and a few numbers) and run inline.
"""

from __future__ import annotations

import contextlib
import os
import re
import secrets
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import msgspec
import structlog

__all__ = ["DEFAULT_MAX_BYTES", "DEFAULT_MAX_COUNT", "ResponseStore", "StoredResponse"]

log = structlog.get_logger("llamad.gateway")

DEFAULT_MAX_COUNT: Final = 10_000
DEFAULT_MAX_BYTES: Final = 256 << 20
_NAME: Final = re.compile(r"^(\d{16})-(resp_[0-9a-f]{16,64})\.json$")
_ID: Final = re.compile(r"^resp_[0-9a-f]{16,64}$")


class StoredResponse(msgspec.Struct, frozen=True, kw_only=True):
    """What a continuation needs of a response, and what ``GET`` answers.

    ``messages``: the whole conversation up to and including this response's
    reply, as chat-template messages (tool calls and results included);
    ``finish_key``: the
    worker's finish row of this turn (hex; empty when the cache policy took
    no finish save), the next turn's ``parent_key``; ``tokens``: what the
    turn's sequence held at its end (prompt and generated tokens), which the
    next turn's prompt begins with; ``cache_salt``: the
    namespace the turn ran in (a continuation runs in the same one);
    ``response``: the OpenAI response object as it was answered.
    """

    id: str
    model: str
    messages: list[dict[str, Any]]
    finish_key: str = ""
    tokens: list[int] = msgspec.field(default_factory=list)
    cache_salt: str | None = None
    tenant: str | None = None
    response: dict[str, Any] = msgspec.field(default_factory=dict)


@dataclass(slots=True)
class _Entry:
    path: Path
    size: int


def new_response_id() -> str:
    return f"resp_{secrets.token_hex(24)}"


def valid_id(response_id: str) -> bool:
    return bool(_ID.match(response_id))


class ResponseStore:
    """The records in ``directory``, bounded by ``max_count`` and ``max_bytes``."""

    def __init__(
        self,
        directory: Path | str,
        *,
        max_count: int = DEFAULT_MAX_COUNT,
        max_bytes: int = DEFAULT_MAX_BYTES,
    ) -> None:
        if max_count < 1 or max_bytes < 1:
            raise ValueError("a response store needs room for at least one record")
        self.directory = Path(directory)
        self.max_count = max_count
        self.max_bytes = max_bytes
        self._entries: OrderedDict[str, _Entry] = OrderedDict()
        self._bytes = 0
        self._seq = 0
        self.directory.mkdir(parents=True, exist_ok=True, mode=0o700)
        self._load()

    def _load(self) -> None:
        found: list[tuple[int, str, Path, int]] = []
        for path in self.directory.iterdir():
            match = _NAME.match(path.name)
            if match is None:
                # A crash's temporary file, or something that is not ours to keep.
                with contextlib.suppress(OSError):
                    path.unlink()
                continue
            with contextlib.suppress(OSError):
                found.append((int(match.group(1)), match.group(2), path, path.stat().st_size))
        for seq, response_id, path, size in sorted(found):
            self._entries[response_id] = _Entry(path, size)
            self._bytes += size
            self._seq = max(self._seq, seq)
        self._evict()
        if self._entries:
            log.info("responses.loaded", count=len(self._entries), bytes=self._bytes)

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, response_id: object) -> bool:
        return response_id in self._entries

    @property
    def bytes(self) -> int:
        return self._bytes

    def put(self, record: StoredResponse) -> bool:
        """Store ``record`` (replacing one of the same id); False when it alone
        is larger than ``max_bytes`` and was not stored."""
        data = msgspec.json.encode(record)
        if len(data) > self.max_bytes:
            log.warning("responses.too_large", id=record.id, bytes=len(data))
            return False
        self.delete(record.id)
        self._seq += 1
        path = self.directory / f"{self._seq:016d}-{record.id}.json"
        tmp = path.with_suffix(".tmp")
        tmp.write_bytes(data)
        os.replace(tmp, path)
        self._entries[record.id] = _Entry(path, len(data))
        self._bytes += len(data)
        self._evict()
        return True

    def get(self, response_id: str) -> StoredResponse | None:
        """The record of ``response_id`` (None: never stored, evicted or deleted)."""
        entry = self._entries.get(response_id)
        if entry is None:
            return None
        try:
            return msgspec.json.decode(entry.path.read_bytes(), type=StoredResponse)
        except (OSError, msgspec.DecodeError, msgspec.ValidationError) as exc:
            log.warning("responses.unreadable", id=response_id, error=str(exc))
            self.delete(response_id)
            return None

    def delete(self, response_id: str) -> bool:
        entry = self._entries.pop(response_id, None)
        if entry is None:
            return False
        self._bytes -= entry.size
        with contextlib.suppress(FileNotFoundError):
            entry.path.unlink()
        return True

    def _evict(self) -> None:
        while self._entries and (
            len(self._entries) > self.max_count or self._bytes > self.max_bytes
        ):
            oldest = next(iter(self._entries))
            self.delete(oldest)
