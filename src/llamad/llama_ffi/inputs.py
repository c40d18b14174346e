"""Checks for the text and paths callers hand to llama.cpp.

llama.cpp takes text and paths as NUL-terminated C strings: a NUL inside a
Python string would silently cut it short there (a grammar, a chat message or
a template name would lose its tail), and text that UTF-8 or the filesystem
encoding cannot represent (lone surrogates) fails on the way in with a bare
``UnicodeEncodeError``. Every public entry point that passes a caller's string
to C goes through one of these, so such input is refused with a typed error
naming the field before anything reaches llama.cpp.
"""

from __future__ import annotations

import os
from pathlib import Path

from llamad.errors import BadRequest, LlamadError
from llamad.llama_ffi.errors import ModelFileError

__all__ = ["c_string", "file_path"]


def c_string(value: object, field: str, error: type[LlamadError] = BadRequest) -> bytes:
    """``value`` as UTF-8 for a C string parameter; ``error`` names ``field`` otherwise."""
    if not isinstance(value, str):
        raise error(
            f"{field}: expected a str, not {type(value).__name__}", details={"field": field}
        )
    if "\0" in value:
        raise error(
            f"{field}: contains a NUL character, which would cut the text short in llama.cpp",
            details={"field": field},
        )
    try:
        return value.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise error(
            f"{field}: not encodable as UTF-8 ({exc.reason} at index {exc.start})",
            details={"field": field},
        ) from None


def file_path(value: object, field: str = "path") -> Path:
    """``value`` (a ``str`` or ``os.PathLike[str]``) as a :class:`Path` the OS can open.

    Raises :class:`ModelFileError` for another type, a NUL, or a name the
    filesystem encoding cannot represent. ``details["path"]`` is the ``repr``
    of the value, which survives the wire whatever the value holds.
    """
    raw = os.fspath(value) if isinstance(value, os.PathLike) else value
    if not isinstance(raw, str):
        raise ModelFileError(
            f"{field}: expected a str or os.PathLike[str], not {type(raw).__name__}",
            details={"field": field, "path": repr(raw)},
        )
    if "\0" in raw:
        raise ModelFileError(
            f"{field}: {raw!r} contains a NUL character",
            details={"field": field, "path": repr(raw)},
        )
    try:
        os.fsencode(raw)
    except UnicodeEncodeError:
        raise ModelFileError(
            f"{field}: {raw!r} cannot be encoded as a file name",
            details={"field": field, "path": repr(raw)},
        ) from None
    return Path(raw)
