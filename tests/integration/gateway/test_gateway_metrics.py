"""Metrics from a real daemon: one scrape reflects the worker, and its counters move (issue 19).

One daemon for the module (the default model, one thread, n_seq_max 4) with
its gateway on a free loopback port. A scrape is ``GET /metrics`` (read with
httpx, requests made with the official ``openai`` package), or the public
client's ``metrics()`` and the Prometheus text it renders to; ``llamad
metrics`` prints the same text. Every scrape is read back with
``prometheus_client``'s own parser. A worker publishes its
counts with its status board after the tick a request ended in (its reply
leaves first), so a scrape is polled until it shows a request, with a
deadline, never slept for.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Iterator

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from cli_run import llamad
from daemon_proc import DaemonProc
from llamad import AsyncClient, CacheHitKind, Client, ContextOverflow
from llamad.client.prometheus import exposition
from llamad.model.results import TokenSource
from served import ENDLESS, EVENTUALLY, MANY, Served, prompt_text, wait_until

pytestmark = [pytest.mark.timeout(300), pytest.mark.model]

GREEDY = {"temperature": 0.0}

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


@pytest.fixture(scope="module")
def served() -> Iterator[DaemonProc]:
    daemon = DaemonProc()
    try:
        daemon.start()
        yield daemon
    finally:
        daemon.close()


@pytest.fixture(scope="module")
def client(served: Served) -> Iterator[Client]:
    with Client(served.endpoint, timeout=120) as c:
        yield c


def parse(text: str) -> Samples:
    out: Samples = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def scrape(client: Client) -> Samples:
    return parse(exposition(client.metrics()))


class Reader:
    """One model's samples of one scrape."""

    def __init__(self, samples: Samples, model: str) -> None:
        self.samples = samples
        self.model = model

    def __call__(self, name: str, **labels: str) -> float:
        key = (name, tuple(sorted({"model_name": self.model, **labels}.items())))
        assert key in self.samples, f"no {key} in the scrape"
        return self.samples[key]

    def daemon(self, name: str, **labels: str) -> float:
        return self.samples.get((name, tuple(sorted(labels.items()))), 0.0)


def scrape_until(client: Client, model: str, ready: Callable[[Reader], bool], what: str) -> Reader:
    def check() -> Reader | None:
        r = Reader(scrape(client), model)
        return r if ready(r) else None

    return wait_until(check, what, EVENTUALLY)


def test_a_scrape_moves_with_each_request_and_a_warm_repeat_moves_the_hits(
    served: Served, client: Client
) -> None:
    m = served.model_id
    before = Reader(scrape(client), m)
    assert before("vllm:num_requests_running") == 0
    assert before("llamad_model_state", state="ready") == 1
    # The thread governor's report (the module's model runs on one thread).
    assert before("llamad_worker_threads") == 1
    assert before("llamad_thread_fallbacks_total") >= 0
    assert before("llamad_thread_collapses_total") >= 0
    assert before("llamad_thread_quiet_probes_total") == 0  # one thread: no fallback to end

    prompt = prompt_text(301)
    cold = client.complete(m, prompt, max_tokens=4, **GREEDY)
    assert cold.cache_hit_kind is CacheHitKind.COLD
    served.wait_saved(cold.finish_key)
    outcome = cold.finish_reason.value
    after = scrape_until(
        client,
        m,
        lambda r: (
            r("llamad_requests_total", outcome=outcome)
            == before("llamad_requests_total", outcome=outcome) + 1
        ),
        "the cold request in the scrape",
    )
    generated = len(cold.generated)
    assert (
        after("vllm:request_success_total", finished_reason=outcome)
        == before("vllm:request_success_total", finished_reason=outcome) + 1
    )
    for name in ("llamad_time_to_first_token_seconds", "vllm:time_to_first_token_seconds"):
        assert after(f"{name}_count") == before(f"{name}_count") + 1
        assert after(f"{name}_sum") > before(f"{name}_sum")
    itl = "vllm:inter_token_latency_seconds_count"
    assert after(itl) == before(itl) + generated - 1
    e2e = "vllm:e2e_request_latency_seconds_count"
    assert after(e2e) == before(e2e) + 1
    for source in TokenSource:
        moved = after("llamad_prompt_tokens_total", source=source.value) - before(
            "llamad_prompt_tokens_total", source=source.value
        )
        assert moved == cold.cache_delta.sources.of(source), source
    prompt_tokens = cold.stats.prompt_tokens
    assert after("vllm:prompt_tokens_total") == before("vllm:prompt_tokens_total") + prompt_tokens
    assert after("vllm:generation_tokens_total") == before("vllm:generation_tokens_total") + (
        generated
    )
    assert after("llamad_cache_queries_total") == before("llamad_cache_queries_total") + 1
    assert after("llamad_cache_hits_total", kind="exact") == before(
        "llamad_cache_hits_total", kind="exact"
    )
    # The cache's own counters (daemon-wide, from its counters file): the
    # finish save published, its bytes held by a tier under its quota.
    finish = ("llamad_cache_saves_total", {"reason": "finish"})
    assert after.daemon(finish[0], **finish[1]) >= before.daemon(finish[0], **finish[1]) + 1
    held = sum(after.daemon("llamad_cache_bytes", tier=t) for t in ("ram", "disk"))
    assert held > 0
    assert after.daemon("llamad_cache_quota_bytes", tier="ram") == 256 << 20

    warm = client.complete(m, prompt, max_tokens=4, **GREEDY)
    assert warm.cache_hit_kind is CacheHitKind.EXACT
    reused = warm.cache_delta.sources.reused
    assert reused > 0
    hit = scrape_until(
        client,
        m,
        lambda r: (
            r("llamad_cache_hits_total", kind="exact")
            == after("llamad_cache_hits_total", kind="exact") + 1
        ),
        "the warm repeat's hit in the scrape",
    )
    assert hit("vllm:prefix_cache_hits_total") == after("vllm:prefix_cache_hits_total") + reused
    assert hit("vllm:prefix_cache_queries_total") == after("vllm:prefix_cache_queries_total") + (
        warm.stats.prompt_tokens
    )
    for source in TokenSource:
        moved = hit("llamad_prompt_tokens_total", source=source.value) - after(
            "llamad_prompt_tokens_total", source=source.value
        )
        assert moved == warm.cache_delta.sources.of(source), source
    assert hit("llamad_cache_queries_total") == after("llamad_cache_queries_total") + 1


def test_a_refused_request_is_counted_as_refused(served: Served, client: Client) -> None:
    m = served.model_id
    before = Reader(scrape(client), m)
    with pytest.raises(ContextOverflow):
        client.complete(m, [1] * 3000, max_tokens=2)  # n_ctx is 2048
    after = scrape_until(
        client,
        m,
        lambda r: (
            r("llamad_requests_total", outcome="refused")
            == before("llamad_requests_total", outcome="refused") + 1
        ),
        "the refusal in the scrape",
    )
    # A refusal is not a success in vLLM's terms, nor a latency.
    assert after("vllm:e2e_request_latency_seconds_count") == before(
        "vllm:e2e_request_latency_seconds_count"
    )


def test_a_scrape_answers_while_the_worker_decodes_and_shows_it_running(
    served: Served, client: Client
) -> None:
    m = served.model_id
    before = Reader(scrape(client), m)
    stream = client.infer(m, prompt_text(302), max_tokens=MANY, grammar=ENDLESS)
    try:
        served.wait_until_busy()
        busy = Reader(scrape(client), m)
        assert busy("vllm:num_requests_running") == busy("llamad_requests_running") == 1
        assert busy("vllm:num_requests_waiting") == 0
        assert 0 < busy("vllm:kv_cache_usage_perc") < 1
    finally:
        stream.cancel()
    done = scrape_until(
        client,
        m,
        lambda r: (
            r("llamad_requests_total", outcome="cancelled")
            == before("llamad_requests_total", outcome="cancelled") + 1
        ),
        "the cancelled request in the scrape",
    )
    assert (
        done("vllm:request_success_total", finished_reason="abort")
        == before("vllm:request_success_total", finished_reason="abort") + 1
    )
    assert done("vllm:num_requests_running") == 0


def test_llamad_metrics_prints_the_exposition_and_the_async_client_reads_it(
    served: Served,
) -> None:
    text = llamad(served.endpoint, "metrics")
    assert text.returncode == 0, text.stderr
    samples = Reader(parse(text.stdout), served.model_id)
    assert samples("vllm:num_requests_waiting") == 0
    assert samples("llamad_model_state", state="ready") == 1
    assert "# TYPE vllm:time_to_first_token_seconds histogram\n" in text.stdout
    as_json = llamad(served.endpoint, "metrics", "--json")
    assert as_json.returncode == 0, as_json.stderr
    snapshot = json.loads(as_json.stdout)
    (model,) = snapshot["models"]
    assert model["model_id"] == served.model_id and model["state"] == "ready"
    assert set(model["histograms"]) == {"ttft", "itl", "e2e", "queue"}

    async def read() -> str:
        async with AsyncClient(served.endpoint, timeout=60) as c:
            return exposition(await c.metrics())

    samples = Reader(parse(asyncio.run(read())), served.model_id)
    assert samples("llamad_model_state", state="ready") == 1


def http_scrape(url: str) -> Samples:
    got = httpx.get(f"{url}/metrics", timeout=EVENTUALLY)
    assert got.status_code == 200, got.text
    assert got.headers["content-type"] == "text/plain; version=0.0.4; charset=utf-8"
    return parse(got.text)


def test_get_metrics_moves_with_openai_requests_and_their_cached_tokens(
    served: DaemonProc,
) -> None:
    m = served.model_id
    url = served.http_url()
    oai = openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0, timeout=EVENTUALLY)
    messages = [{"role": "user", "content": prompt_text(304)}]
    before = Reader(http_scrape(url), m)
    cold = oai.chat.completions.create(model=m, messages=messages, max_tokens=4, temperature=0)
    assert cold.usage is not None

    # A request's last count is its e2e observation: wait for that one.
    e2e = "vllm:e2e_request_latency_seconds_count"

    def scraped(r: Reader) -> bool:
        return r(e2e) == before(e2e) + 1

    def http_until(ready: Callable[[Reader], bool], what: str) -> Reader:
        return wait_until(
            lambda: r if ready(r := Reader(http_scrape(url), m)) else None, what, EVENTUALLY
        )

    after = http_until(scraped, "the chat request in GET /metrics")
    assert after("vllm:prompt_tokens_total") == before("vllm:prompt_tokens_total") + (
        cold.usage.prompt_tokens
    )
    assert after("vllm:generation_tokens_total") == before("vllm:generation_tokens_total") + (
        cold.usage.completion_tokens
    )
    assert (
        after("vllm:time_to_first_token_seconds_count")
        == before("vllm:time_to_first_token_seconds_count") + 1
    )

    warm = oai.chat.completions.create(model=m, messages=messages, max_tokens=4, temperature=0)
    assert warm.usage is not None and warm.usage.prompt_tokens_details is not None
    cached = warm.usage.prompt_tokens_details.cached_tokens or 0
    assert cached > 0
    hit = http_until(lambda r: r(e2e) == after(e2e) + 1, "the warm repeat in GET /metrics")
    # What the OpenAI client was told it reused is what the hit counter moved by.
    assert hit("vllm:prefix_cache_hits_total") == after("vllm:prefix_cache_hits_total") + cached
    assert (
        hit("llamad_cache_hits_total", kind="exact")
        == after("llamad_cache_hits_total", kind="exact") + 1
    )


def test_a_worker_restart_reads_as_a_counter_reset(served: Served, client: Client) -> None:
    """Last in the module: it restarts the worker."""
    m = served.model_id
    client.complete(m, prompt_text(303), max_tokens=2, **GREEDY)
    before = scrape_until(
        client,
        m,
        lambda r: r("vllm:time_to_first_token_seconds_count") > 0,
        "a request in the scrape",
    )
    old = served.kill_worker()
    served.wait_worker_back(old)
    after = scrape_until(
        client,
        m,
        lambda r: (
            ("llamad_requests_running", (("model_name", m),)) in r.samples
            and r("llamad_worker_restarts_total") == before("llamad_worker_restarts_total") + 1
        ),
        "the restarted worker in the scrape",
    )
    # The new worker counts from zero: Prometheus's rate() sees a reset.
    assert after("vllm:time_to_first_token_seconds_count") == 0
    assert after("vllm:request_success_total", finished_reason="length") == 0
    assert after("vllm:prompt_tokens_total") == 0
