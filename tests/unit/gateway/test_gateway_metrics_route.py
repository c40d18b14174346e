"""``GET /metrics`` on the gateway's app, over a stand-in client: the gate's rules, the
content type, errors as text with their status."""

from __future__ import annotations

import hashlib
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families
from starlette.testclient import TestClient

from llamad.config.sections import HttpKey, HttpSection
from llamad.errors import Unavailable
from llamad.front.wire import MetricsSnapshot, ModelMetrics, ModelState
from llamad.gateway.app import build_app
from llamad.gateway.gate import Gate

pytestmark = pytest.mark.timeout(30)

KEY = "sk-test-metrics"


class StandIn:
    """The one AsyncClient method the route uses; ``error`` makes it fail."""

    def __init__(self) -> None:
        self.error: Exception | None = None
        self.calls = 0

    async def metrics(self, **_: Any) -> MetricsSnapshot:
        self.calls += 1
        if self.error is not None:
            raise self.error
        model = ModelMetrics(model_id="smol", state=ModelState.READY, n_ctx=2048)
        return MetricsSnapshot(at=2.0, started_at=1.0, uptime_s=1.0, models=[model])


def _app(*, keys: bool) -> tuple[TestClient, StandIn]:
    table = {"ops": HttpKey(sha256=hashlib.sha256(KEY.encode()).hexdigest())} if keys else {}
    client = StandIn()
    gate = Gate(HttpSection(keys=table), client)
    return TestClient(build_app(gate)), client


def test_a_scrape_is_prometheus_text_of_the_snapshot() -> None:
    http, client = _app(keys=False)
    got = http.get("/metrics")
    assert got.status_code == 200
    assert got.headers["content-type"] == "text/plain; version=0.0.4; charset=utf-8"
    found = {f.name: f for f in text_string_to_metric_families(got.text)}
    (ready,) = [s for s in found["llamad_model_state"].samples if s.labels["state"] == "ready"]
    assert ready.labels["model_name"] == "smol" and ready.value == 1
    assert found["llamad_uptime_seconds"].samples[0].value == 1.0
    assert client.calls == 1


def test_with_keys_a_scrape_needs_one() -> None:
    http, client = _app(keys=True)
    refused = http.get("/metrics")
    assert refused.status_code == 401
    assert refused.text.startswith("invalid_api_key: ")
    assert client.calls == 0
    ok = http.get("/metrics", headers={"Authorization": f"Bearer {KEY}"})
    assert ok.status_code == 200 and "llamad_model_state" in ok.text


def test_a_daemon_error_is_its_status_in_text() -> None:
    http, client = _app(keys=False)
    client.error = Unavailable("the daemon's front is stopping")
    got = http.get("/metrics")
    assert got.status_code == 503
    assert got.text == "unavailable: the daemon's front is stopping\n"


def test_only_get_is_served() -> None:
    http, _ = _app(keys=False)
    got = http.post("/metrics")
    assert got.status_code == 405
    assert got.headers["content-type"].startswith("text/plain")
