"""Memory-pressure scheduler (SPEC C9): evict cache rows when memory runs short.

A :class:`PressureSource` reports ``(used, total)`` bytes. Every
``interval_s`` the :class:`PressureScheduler` samples it; when
``used / total`` reaches ``high_watermark`` it asks cache-meta to evict enough
bytes to bring the ratio down to ``low_watermark`` (at least
``min_evict_bytes``), from ``evict_tiers`` only: the disk tier fills to its own
quota and evicting it frees no memory.

The scheduler is off by default. It is a plain object stepped by cache-meta's
loop (:meth:`PressureScheduler.poll`), so its evictions go through the one
writer like every other mutation; a source that is slow to sample (an
external command) is wrapped in a :class:`BackgroundSampler` so the loop
never waits on it.

Sources: ``system`` (psutil: ``total - available``, which counts tmpfs and
shared-memory pages, i.e. the ``ram`` and ``ram_file`` tiers), ``nvidia_smi``
(used and total memory summed over every visible GPU; a host without the tool
reads as no pressure), ``noop``, or any callable returning ``(used, total)``.
"""

from __future__ import annotations

import math
import shutil
import subprocess
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Final, Protocol

import structlog

from llamad.cache.errors import InvalidCacheValue
from llamad.cache.tier_kind import TierKind, check_tier
from llamad.errors import ConfigError
from llamad.tiers import LOCAL_TIERS

log = structlog.get_logger("llamad.cache.pressure")

SOURCES: Final = ("system", "nvidia_smi", "noop", "callable")

Sample = tuple[int, int]
"""``(used bytes, total bytes)``; a total of 0 means "no reading"."""

__all__ = [
    "SOURCES",
    "BackgroundSampler",
    "CallablePressure",
    "NoopPressure",
    "NvidiaSmiPressure",
    "PressureConfig",
    "PressureReport",
    "PressureScheduler",
    "PressureSource",
    "Sample",
    "SystemPressure",
    "make_source",
]


class PressureSource(Protocol):
    """Something that knows how full memory is."""

    name: str

    def sample(self) -> Sample:
        """Current ``(used, total)`` in bytes; ``(0, 0)`` when unknown."""
        ...


class NoopPressure:
    """Always reports no pressure."""

    name = "noop"

    def sample(self) -> Sample:
        return (0, 0)


class SystemPressure:
    """Host memory through psutil: used is everything not available."""

    name = "system"

    def sample(self) -> Sample:
        # Imported by the first sample: the poller is off by default, and every
        # daemon process imports this module for its config types (SPEC P9).
        import psutil  # noqa: PLC0415

        vm = psutil.virtual_memory()
        return (int(vm.total - vm.available), int(vm.total))


class NvidiaSmiPressure:
    """GPU memory summed over every GPU ``nvidia-smi`` lists.

    A missing binary, a non-zero exit, a timeout or unparsable output all read
    as "no reading" (no pressure) and are logged once per change of state.
    """

    name = "nvidia_smi"
    QUERY: Final = ("--query-gpu=memory.used,memory.total", "--format=csv,noheader,nounits")

    def __init__(self, binary: str = "nvidia-smi", timeout_s: float = 5.0) -> None:
        self.binary = binary
        self.timeout_s = timeout_s
        self.last_error: str | None = None

    def _fail(self, why: str) -> Sample:
        if why != self.last_error:
            log.warning("cache.pressure_source_unavailable", source=self.name, error=why)
        self.last_error = why
        return (0, 0)

    def sample(self) -> Sample:
        exe = shutil.which(self.binary)
        if exe is None:
            return self._fail(f"{self.binary} not found")
        try:
            done = subprocess.run(
                [exe, *self.QUERY],
                capture_output=True,
                text=True,
                timeout=self.timeout_s,
                check=False,
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            return self._fail(str(exc))
        if done.returncode != 0:
            return self._fail(f"exit {done.returncode}: {done.stderr.strip()[:200]}")
        parsed = parse_nvidia_smi(done.stdout)
        if parsed is None:
            return self._fail("unparsable output")
        self.last_error = None
        return parsed


def parse_nvidia_smi(text: str) -> Sample | None:
    """Sum ``used, total`` MiB lines into bytes; ``None`` if any line is malformed."""
    used = total = 0
    lines = [line for line in text.splitlines() if line.strip()]
    if not lines:
        return None
    for line in lines:
        parts = [p.strip() for p in line.split(",")]
        if len(parts) != 2:
            return None
        try:
            u, t = int(float(parts[0])), int(float(parts[1]))
        except ValueError:
            return None
        if u < 0 or t <= 0:
            return None
        used += u << 20
        total += t << 20
    return (used, total)


class CallablePressure:
    """A user function returning ``(used, total)`` bytes (or a ratio in [0, 1])."""

    name = "callable"

    def __init__(self, fn: Callable[[], Sample | float]) -> None:
        if not callable(fn):
            raise ConfigError(
                "pressure source callable is not callable", details={"field": "source"}
            )
        self.fn = fn

    def sample(self) -> Sample:
        value = self.fn()
        if isinstance(value, tuple):
            used, total = value
            return (int(used), int(total))
        ratio = float(value)
        if not math.isfinite(ratio) or ratio < 0:
            raise ValueError(f"pressure ratio {value!r} is not a finite number >= 0")
        # A bare ratio has no byte scale; report it against a notional 1 GiB.
        return (int(ratio * (1 << 30)), 1 << 30)


class BackgroundSampler:
    """Samples a slow source on its own thread; :meth:`sample` returns the latest."""

    def __init__(self, source: PressureSource, interval_s: float) -> None:
        self.source = source
        self.name = source.name
        self.interval_s = interval_s
        self._latest: Sample = (0, 0)
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=self._run, name=f"pressure-{source.name}", daemon=True
        )
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self._latest = self.source.sample()
            except Exception as exc:  # a broken source must not kill the thread
                log.warning("cache.pressure_sample_failed", source=self.name, error=str(exc))
                self._latest = (0, 0)
            self._stop.wait(self.interval_s)

    def sample(self) -> Sample:
        return self._latest

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=self.source_timeout())

    def source_timeout(self) -> float:
        return float(getattr(self.source, "timeout_s", 1.0)) + 1.0


@dataclass(frozen=True, slots=True)
class PressureConfig:
    """Scheduler settings (SPEC C9 defaults); invalid values raise naming the field."""

    enabled: bool = False
    source: str = "system"
    interval_s: float = 5.0
    high_watermark: float = 0.85
    low_watermark: float = 0.75
    min_evict_bytes: int = 1 << 20
    evict_tiers: tuple[TierKind, ...] = (TierKind.RAM, TierKind.RAM_FILE)

    def __post_init__(self) -> None:
        if not isinstance(self.enabled, bool):
            raise ConfigError("enabled must be a bool", details={"field": "enabled"})
        if self.source not in SOURCES:
            raise ConfigError(
                f"source must be one of {', '.join(SOURCES)}, not {self.source!r}",
                details={"field": "source"},
            )
        for name in ("interval_s", "high_watermark", "low_watermark"):
            value = getattr(self, name)
            if (
                isinstance(value, bool)
                or not isinstance(value, int | float)
                or not math.isfinite(value)
            ):
                raise ConfigError(f"{name} must be a finite number", details={"field": name})
        if self.interval_s <= 0:
            raise ConfigError("interval_s must be > 0", details={"field": "interval_s"})
        if not 0 < self.high_watermark <= 1:
            raise ConfigError(
                "high_watermark must lie in (0, 1]", details={"field": "high_watermark"}
            )
        if not 0 <= self.low_watermark < self.high_watermark:
            raise ConfigError(
                "low_watermark must lie in [0, high_watermark)", details={"field": "low_watermark"}
            )
        if isinstance(self.min_evict_bytes, bool) or not isinstance(self.min_evict_bytes, int):
            raise ConfigError(
                "min_evict_bytes must be an int", details={"field": "min_evict_bytes"}
            )
        if self.min_evict_bytes < 0:
            raise ConfigError("min_evict_bytes must be >= 0", details={"field": "min_evict_bytes"})
        try:
            tiers = tuple(check_tier(t, "evict_tiers") for t in self.evict_tiers)
        except (InvalidCacheValue, TypeError):
            tiers = ()
        # Evicting the shared remote tier frees no memory here (and it is not
        # cache-meta's to evict).
        if not tiers or not set(tiers) <= set(LOCAL_TIERS):
            raise ConfigError(
                f"evict_tiers must be a non-empty subset of {', '.join(LOCAL_TIERS)}",
                details={"field": "evict_tiers"},
            )
        object.__setattr__(self, "evict_tiers", tiers)


@dataclass(frozen=True, slots=True)
class PressureReport:
    """One check: what was sampled and what was done about it."""

    ratio: float | None
    used: int
    total: int
    requested: int = 0
    evicted_rows: int = 0
    evicted_bytes: int = 0
    action: str = "none"  # none | evicted | disabled | no_reading | error

    def to_wire(self) -> dict[str, Any]:
        return {
            "ratio": self.ratio,
            "used": self.used,
            "total": self.total,
            "requested": self.requested,
            "evicted_rows": self.evicted_rows,
            "evicted_bytes": self.evicted_bytes,
            "action": self.action,
        }


EvictFn = Callable[[int, Sequence[TierKind]], tuple[int, int]]
"""``evict(n_bytes, tiers) -> (rows, bytes freed)``: cache-meta's ``evict_bytes``."""


@dataclass(slots=True)
class _Totals:
    checks: int = 0
    triggered: int = 0
    rows: int = 0
    bytes: int = 0
    last: PressureReport | None = None
    last_at: float | None = None
    last_error: str | None = None


class PressureScheduler:
    """Decides when and how much to evict; stepped by its owner's loop."""

    def __init__(
        self,
        config: PressureConfig,
        source: PressureSource,
        evict: EvictFn,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.config = config
        self.source = source
        self._evict = evict
        self._clock = clock
        self._next = clock() + config.interval_s
        self._totals = _Totals()

    def next_due(self) -> float | None:
        """When :meth:`poll` next has work (``None`` while disabled)."""
        return self._next if self.config.enabled else None

    def poll(self) -> PressureReport | None:
        """Run a check if one is due; ``None`` when not due or disabled."""
        if not self.config.enabled or self._clock() < self._next:
            return None
        return self.force_check()

    def force_check(self) -> PressureReport:
        """Check now (still evicting nothing while disabled) and restart the interval."""
        self._next = self._clock() + self.config.interval_s
        totals = self._totals
        totals.checks += 1
        totals.last_at = self._clock()
        try:
            used, total = self.source.sample()
        except Exception as exc:
            totals.last_error = str(exc)
            log.warning("cache.pressure_sample_failed", source=self.source.name, error=str(exc))
            report = PressureReport(None, 0, 0, action="error")
            totals.last = report
            return report
        if total <= 0:
            report = PressureReport(None, used, total, action="no_reading")
        else:
            ratio = used / total
            report = PressureReport(ratio, used, total)
            if not self.config.enabled:
                report = PressureReport(ratio, used, total, action="disabled")
            elif ratio >= self.config.high_watermark:
                target = used - int(self.config.low_watermark * total)
                requested = max(target, self.config.min_evict_bytes)
                rows, freed = self._evict(requested, self.config.evict_tiers)
                totals.triggered += 1
                totals.rows += rows
                totals.bytes += freed
                report = PressureReport(ratio, used, total, requested, rows, freed, "evicted")
                log.info(
                    "cache.pressure_evicted",
                    source=self.source.name,
                    ratio=round(ratio, 4),
                    requested=requested,
                    rows=rows,
                    bytes=freed,
                )
        totals.last = report
        return report

    def status(self) -> dict[str, Any]:
        """Configuration, the last reading and what the scheduler has evicted so far."""
        cfg = self.config
        totals = self._totals
        return {
            "enabled": cfg.enabled,
            "pressure_source": self.source.name,
            "interval_s": cfg.interval_s,
            "high_watermark": cfg.high_watermark,
            "low_watermark": cfg.low_watermark,
            "min_evict_bytes": cfg.min_evict_bytes,
            "evict_tiers": list(cfg.evict_tiers),
            "checks": totals.checks,
            "evictions_triggered": totals.triggered,
            "rows_evicted": totals.rows,
            "bytes_evicted": totals.bytes,
            "last": None if totals.last is None else totals.last.to_wire(),
            "last_error": totals.last_error,
        }


def make_source(
    config: PressureConfig, fn: Callable[[], Sample | float] | None = None
) -> PressureSource:
    """The source a config names; ``callable`` needs ``fn``. Slow sources run in the background."""
    if config.source == "system":
        return SystemPressure()
    if config.source == "noop":
        return NoopPressure()
    if config.source == "nvidia_smi":
        smi = NvidiaSmiPressure()
        # Only a running scheduler needs readings without blocking the loop.
        return BackgroundSampler(smi, config.interval_s) if config.enabled else smi
    if fn is None:
        raise ConfigError("source 'callable' needs a function", details={"field": "source"})
    return CallablePressure(fn)
