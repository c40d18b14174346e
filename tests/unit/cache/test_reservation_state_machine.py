"""The reservation state machine against a model (hypothesis stateful test).

Writers race on a few keys through every protocol step, with stale tokens,
cancels, deaths and TTL expiry mixed in. The invariants: a key is never both
published and reserved, byte accounting matches the tables, a stale token is
always refused, a dead owner keeps nothing, nothing survives its TTL, and a
row once published (or adopted) stays until evicted.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from llamad.cache.errors import AlreadyCached, InvalidCacheValue, PublishAbandoned, SaveInFlight
from llamad.cache.reservation import Stage
from llamad.cache.tier_kind import TierKind
from meta_fakes import intent, kvc_meta, make_meta

pytestmark = pytest.mark.timeout(120)

KEYS = [intent([i, 100 + i], size=100 * (i + 1)) for i in range(2)]
OWNERS = [11, 12]
TTL = 10.0


@dataclass
class Model:
    token: int
    owner: int
    stage: Stage
    linked: bool = False


class ReservationMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.meta, self.store, self.clock, _ = make_meta(ttl=TTL)
        self.model: dict[int, Model] = {}
        self.published: set[int] = set()
        self.stale: list[tuple[int, int]] = []

    def _abandoned(self, k: int, linked: bool) -> None:
        """Model what reaping does: a linked file is adopted, anything else dropped."""
        m = self.model.pop(k)
        self.stale.append((k, m.token))
        if m.stage is not Stage.RESERVED and linked:
            self.published.add(k)

    @rule(k=st.integers(0, 1), o=st.sampled_from(OWNERS))
    def reserve(self, k: int, o: int) -> None:
        it = KEYS[k]
        if k in self.published:
            with pytest.raises(AlreadyCached):
                self.meta.reserve_save(it, o)
            return
        if k in self.model:
            with pytest.raises(SaveInFlight):
                self.meta.reserve_save(it, o)
            return
        token = self.meta.reserve_save(it, o)
        self.model[k] = Model(token, o, Stage.RESERVED)

    @rule(k=st.integers(0, 1))
    def check(self, k: int) -> None:
        m = self.model.get(k)
        if m is None:
            return
        self.meta.check_reservation(KEYS[k].key, m.token)
        if m.stage is Stage.RESERVED:
            m.stage = Stage.CHECKED

    @rule(k=st.integers(0, 1))
    def link(self, k: int) -> None:
        m = self.model.get(k)
        if m is None:
            return
        it = KEYS[k]
        location = f"/disk/{it.key.hex()}.kvc"
        if m.stage is Stage.RESERVED:
            with pytest.raises(InvalidCacheValue):
                self.meta.mark_published(it.key, m.token, location)
            return
        # The writer linked: from now on a reaper finds a valid file.
        self.store.linked[it.key] = kvc_meta(it)
        self.store.files[("disk", location)] = it.key
        m.linked = True
        self.meta.mark_published(it.key, m.token, location)
        m.stage = Stage.LINKED

    @rule(k=st.integers(0, 1))
    def announce(self, k: int) -> None:
        m = self.model.get(k)
        if m is None or m.stage is not Stage.LINKED:
            return
        self.meta.announce_saved(KEYS[k].key, m.token)
        self.store.linked.pop(KEYS[k].key, None)
        del self.model[k]
        self.stale.append((k, m.token))
        self.published.add(k)

    @rule(k=st.integers(0, 1))
    def cancel(self, k: int) -> None:
        m = self.model.get(k)
        if m is None:
            return
        assert self.meta.cancel_reservation(KEYS[k].key, m.token)
        # A writer that cancels after linking unlinks its file itself.
        self.store.linked.pop(KEYS[k].key, None)
        del self.model[k]
        self.stale.append((k, m.token))

    @rule(data=st.data())
    def stale_token_is_refused(self, data: st.DataObject) -> None:
        if not self.stale:
            return
        k, token = data.draw(st.sampled_from(self.stale))
        with pytest.raises(PublishAbandoned):
            self.meta.check_reservation(KEYS[k].key, token)
        assert not self.meta.cancel_reservation(KEYS[k].key, token)

    @rule(o=st.sampled_from(OWNERS))
    def owner_dies(self, o: int) -> None:
        for k in [k for k, m in self.model.items() if m.owner == o]:
            self._abandoned(k, self.model[k].linked)
        self.meta.owner_down(o)
        assert all(r.owner != o for r in self.meta.reservations.values())

    @rule(
        k=st.integers(0, 1),
        o=st.sampled_from(OWNERS),
        stage=st.sampled_from([Stage.RESERVED, Stage.CHECKED, Stage.LINKED]),
    )
    def writer_dies_mid_publish(self, k: int, o: int, stage: Stage) -> None:
        """A save up to ``stage``, then its writer dies: the paths the reaper must get right."""
        if k in self.model or k in self.published:
            return
        self.reserve(k, o)
        if stage >= Stage.CHECKED:
            self.check(k)
        if stage >= Stage.LINKED:
            self.link(k)
        self.owner_dies(o)

    @rule(dt=st.floats(0.5, 2 * TTL))
    def time_passes(self, dt: float) -> None:
        self.clock.advance(dt)
        due = [
            k
            for k, m in self.model.items()
            if self.meta.reservations[KEYS[k].key].deadline <= self.clock.now
        ]
        for k in due:
            self._abandoned(k, self.model[k].linked)
        self.meta.tick()

    @rule(k=st.integers(0, 1))
    def evict(self, k: int) -> None:
        if k in self.published:
            self.meta.evict_bytes(10**9)
            self.published.clear()

    @invariant()
    def tables_match_the_model(self) -> None:
        assert {KEYS[k].key for k in self.model} == set(self.meta.reservations)
        assert {KEYS[k].key for k in self.published} == set(self.meta.rows)
        assert not set(self.meta.rows) & set(self.meta.reservations)
        ledger = self.meta.ledgers[TierKind.DISK]
        assert ledger.reserved == sum(r.intent.size for r in self.meta.reservations.values())
        assert ledger.used == sum(r.size for r in self.meta.rows.values())
        for k, m in self.model.items():
            res = self.meta.reservations[KEYS[k].key]
            assert (res.token, res.owner, res.stage) == (m.token, m.owner, m.stage)

    def teardown(self) -> None:
        # Nothing outlives its TTL: no reservation leaks.
        self.clock.advance(2 * TTL)
        self.meta.tick()
        assert self.meta.reservations == {}
        assert self.meta.ledgers[TierKind.DISK].reserved == 0


ReservationMachine.TestCase.settings = settings(
    max_examples=100, stateful_step_count=30, deadline=None
)
test_reservation_state_machine = ReservationMachine.TestCase
