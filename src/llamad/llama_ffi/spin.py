"""Bound how long ggml's threads spin at a barrier before sleeping (SPEC M14).

The pinned CPU build runs ggml's graph under OpenMP, so every barrier between
two graph nodes (several hundred per decoded token) is a libgomp barrier. A
thread that reaches one first spins ``GOMP_SPINCOUNT`` times before it sleeps
on a futex; libgomp's default is 300,000 spins, about 3-4 ms. When another
process holds the core its partner needs, each barrier burns that whole spin
while the partner waits for the spinner's core: measured here, 2 threads with
two CPU hogs beside them decoded at ~2.4 s per token, ~230x their quiet 10 ms
(``docs/internals/threads.md``). A spin of a few thousand (tens of
microseconds, about what a futex wake-up costs) keeps the quiet speed and
turns the collapse into a slowdown of ~1.5-3x, which
:mod:`llamad.model.threads` then detects and answers with fewer threads.

libgomp reads the variable once, when it is loaded (with ``libllama``), so
:func:`bound_openmp_spin` must run before the binding's extension is imported;
:mod:`llamad.llama_ffi.native` calls it first thing. An operator's own
``GOMP_SPINCOUNT`` or ``OMP_WAIT_POLICY`` is left alone.
"""

from __future__ import annotations

import enum
import os
from collections.abc import MutableMapping
from pathlib import Path
from typing import Final

__all__ = ["DEFAULT_SPINCOUNT", "SpinSetting", "bound_openmp_spin", "spin_setting"]

DEFAULT_SPINCOUNT: Final = 3000
"""Spins before a waiting ggml thread sleeps (libgomp's default: 300,000)."""

_ENV: Final = "GOMP_SPINCOUNT"
_POLICY_ENV: Final = "OMP_WAIT_POLICY"
# Marks a GOMP_SPINCOUNT that llamad set (children inherit it), so that a
# worker started by a llamad process does not mistake it for an operator's.
_OURS_ENV: Final = "LLAMAD_GOMP_SPINCOUNT"


class SpinSetting(enum.Enum):
    """What :func:`bound_openmp_spin` found and did."""

    BOUNDED = "bounded"  # we set GOMP_SPINCOUNT before libgomp loaded
    OPERATOR = "operator"  # GOMP_SPINCOUNT or OMP_WAIT_POLICY was already set
    TOO_LATE = "too_late"  # libgomp was already loaded (by another library): no effect
    NOT_YET = "not_yet"  # bound_openmp_spin has not run in this process


_setting = SpinSetting.NOT_YET


def _libgomp_loaded(maps: Path) -> bool:
    try:
        return "libgomp" in maps.read_text()
    except OSError:  # pragma: no cover - no procfs: assume not loaded
        return False


def bound_openmp_spin(
    environ: MutableMapping[str, str] | None = None,
    *,
    spincount: int = DEFAULT_SPINCOUNT,
    maps: Path = Path("/proc/self/maps"),
) -> SpinSetting:
    """Set ``GOMP_SPINCOUNT`` to ``spincount`` unless the operator chose a
    spin policy or libgomp is already loaded; returns what happened (also
    kept for :func:`spin_setting`). Child processes inherit the bound, and
    know it for llamad's (``LLAMAD_GOMP_SPINCOUNT`` records it)."""
    global _setting
    if environ is None and _setting is not SpinSetting.NOT_YET:
        return _setting  # once per process: our own bound must not read as the operator's
    env = os.environ if environ is None else environ
    inherited = _ENV in env and env.get(_OURS_ENV) == env[_ENV] and _POLICY_ENV not in env
    if (_ENV in env or _POLICY_ENV in env) and not inherited:
        result = SpinSetting.OPERATOR
    elif _libgomp_loaded(maps):
        result = SpinSetting.TOO_LATE
    else:
        if not inherited:
            env[_ENV] = env[_OURS_ENV] = str(spincount)
        result = SpinSetting.BOUNDED
    if environ is None:
        _setting = result
    return result


def spin_setting() -> SpinSetting:
    """What the binding did about libgomp's spin in this process."""
    return _setting
