"""bench/soak.py's ledger: every request the clients started and each terminal it got.

A request is written in before it is sent and given one outcome per
terminal the client sees: a reply or a ``done`` (``ok``; ``cancelled`` when
the client left the stream or asked the worker to stop it; ``mismatch`` for
a reply that does not continue the request's own prompt), a typed error
(``error:<code>``), or anything else (``untyped:...``). Lost: no terminal,
or a timeout (a reply that never came); duplicated: more than one. Pure,
unit-tested in ``tests/unit/test_soak_report.py``. A recorded run keeps every
request (:meth:`Ledger.requests`) and its report counts them
(:func:`summarize`).
"""

from __future__ import annotations

import itertools
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

#: Error codes a client may see in this soak, and why. Anything else fails "every error
#: expected"; a timeout is a reply that never came and counts as lost.
EXPECTED_CODES: dict[str, str] = {
    "worker_crashed": "the request was in flight on the worker the killer SIGKILLed",
    "no_session": "a session went on (or ended) after its worker was killed: "
    "its sequence died with it",
}
LOST_CODES = frozenset({"timeout"})

OK = "ok"
CANCELLED = "cancelled"  # the client left the stream, or asked the worker to stop it
MISMATCH = "mismatch"  # a reply that does not continue the request's own prompt


def error_outcome(code: str) -> str:
    return f"error:{code}"


def untyped_outcome(exc: BaseException) -> str:
    return f"untyped:{type(exc).__name__}: {exc}"[:200]


@dataclass
class _Request:
    kind: str
    model: str
    started: float
    ends: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class KindCounts:
    kind: str
    started: int = 0
    served: int = 0  # ok
    cancelled: int = 0
    errors: int = 0  # typed, expected or not (timeouts excluded)
    lost: int = 0
    duplicated: int = 0
    untyped: int = 0
    mismatched: int = 0


@dataclass(frozen=True)
class LedgerSummary:
    kinds: list[KindCounts]
    errors: dict[str, Counter[str]]  # code -> kinds it came from
    untyped: list[str]  # the first few untyped failures, as text
    lost: list[str]  # request ids
    duplicated: list[str]

    @property
    def total(self) -> KindCounts:
        out: dict[str, int] = Counter()
        for k in self.kinds:
            for name in ("started", "served", "cancelled", "errors", "lost", "duplicated"):
                out[name] += getattr(k, name)
            for name in ("untyped", "mismatched"):
                out[name] += getattr(k, name)
        return KindCounts("all", **out)

    @property
    def unexpected_codes(self) -> list[str]:
        return sorted(c for c in self.errors if c not in EXPECTED_CODES)


class Ledger:
    """Every request the clients started, and each terminal outcome it got.

    ``start`` before sending; ``end`` once per terminal the client saw (a
    ``done``, an error, a reply, or leaving the stream). Thread-safe.
    """

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._requests: dict[str, _Request] = {}
        self._ids = itertools.count()

    def start(self, kind: str, model: str) -> str:
        with self._lock:
            rid = f"soak-{next(self._ids)}"
            self._requests[rid] = _Request(kind, model, self._clock())
        return rid

    def end(self, rid: str, outcome: str) -> None:
        with self._lock:
            self._requests[rid].ends.append(outcome)

    def requests(self) -> list[list[object]]:
        """Every request as ``[kind, model, [outcome, ...]]``, in the order they
        started (request ``soak-<i>`` is the i-th): what a recorded run keeps."""
        with self._lock:
            requests = list(self._requests.values())
        return [[r.kind, r.model, list(r.ends)] for r in requests]

    def summary(self) -> LedgerSummary:
        return summarize(self.requests())


def summarize(requests: Iterable[Sequence[object]]) -> LedgerSummary:
    """The counts of :meth:`Ledger.requests` (``[kind, model, ends]`` in order)."""
    counts: dict[str, Counter[str]] = defaultdict(Counter)
    errors: dict[str, Counter[str]] = defaultdict(Counter)
    untyped: list[str] = []
    lost: list[str] = []
    duplicated: list[str] = []
    for i, (kind, _model, ends) in enumerate(requests):
        assert isinstance(kind, str) and isinstance(ends, list)
        rid = f"soak-{i}"
        c = counts[kind]
        c["started"] += 1
        if len(ends) > 1:
            c["duplicated"] += 1
            duplicated.append(rid)
        codes = [o.split(":", 1)[1] for o in ends if o.startswith("error:")]
        if not ends or any(code in LOST_CODES for code in codes):
            c["lost"] += 1
            lost.append(rid)
        for outcome in ends[:1]:
            if outcome == OK:
                c["served"] += 1
            elif outcome == CANCELLED:
                c["cancelled"] += 1
            elif outcome == MISMATCH:
                c["mismatched"] += 1
            elif outcome.startswith("untyped:"):
                c["untyped"] += 1
                untyped.append(f"{kind}: {outcome}")
        for code in codes:
            if code not in LOST_CODES:
                c["errors"] += 1
            errors[code][kind] += 1
    kinds = [KindCounts(kind, **c) for kind, c in sorted(counts.items())]
    return LedgerSummary(kinds, dict(errors), untyped[:10], lost, duplicated)
