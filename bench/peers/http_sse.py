"""The one HTTP client of the HTTP bars (P10, P11, HTTP overhead), the same for every system.

Both servers get the same request, ``POST /v1/completions`` (OpenAI's text
completion, which both llamad's gateway and llama-server serve) with the
prompt as token ids (the same ids), greedy, ``stream: true`` with
``stream_options.include_usage``, and the same plain reader: the standard
library's :mod:`http.client`, Server-Sent Events split on lines and each
``data:`` line parsed with :mod:`json`. No SDK sits in
between (the ``openai`` package would add its own milliseconds, the same for
both, but not the same as a user's).

What is timed, on the client's :func:`time.perf_counter`:

- **TTFT**: from just before the request is written on a connection that is
  already open to the parsing of the first chunk that carries a choice
  (``choices[0]``: the first sampled token's text). Every request gets a new
  connection, opened before the timer starts: llama-server closes a
  connection after each streamed reply without saying so (no
  ``Connection: close``; the next request on it fails), so keep-alive cannot
  be had on both sides, and a fresh connection per request, its connect
  untimed, is the same for both.
- **Token arrivals**: the time each chunk with non-empty ``text`` was parsed
  (one per token; a token whose text is an incomplete UTF-8 sequence comes
  with the next one on both servers), fed to
  :func:`bench.worker_bench_report.steady_rate` for decode rates.
- ``usage.prompt_tokens_details.cached_tokens`` (both servers fill it: llamad
  from ``cache_delta.sources.reused``, llama-server from its ``cache_n``) and
  llama-server's ``timings``, where the stream carries them, untimed.
"""

from __future__ import annotations

import http.client
import json
import time
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit


@dataclass
class HttpReply:
    """One streamed completion as the client saw it."""

    ttft_ms: float
    arrivals: list[float]
    text: str
    cached: int | None = None  # usage.prompt_tokens_details.cached_tokens
    timings: dict[str, Any] = field(default_factory=dict)


def completion_body(model: str, prompt: list[int], max_tokens: int) -> dict[str, Any]:
    """The request both servers get: greedy, streamed, usage in the last chunk."""
    return {
        "model": model,
        "prompt": prompt,
        "max_tokens": max_tokens,
        "temperature": 0.0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }


def read_events(lines: Any, started: float) -> HttpReply:
    """An OpenAI text-completion SSE stream (an iterable of raw lines) read to
    its ``[DONE]``, timed from ``started`` (see the module's docstring)."""
    first: float | None = None
    arrivals: list[float] = []
    text: list[str] = []
    cached: int | None = None
    timings: dict[str, Any] = {}
    for raw in lines:
        line = raw.strip()
        if not line.startswith(b"data:"):
            continue
        data = line[5:].strip()
        if data == b"[DONE]":
            break
        now = time.perf_counter()
        event = json.loads(data)
        if "error" in event:
            raise RuntimeError(f"stream error: {event['error']}")
        choices = event.get("choices") or []
        if choices:
            if first is None:
                first = now
            piece = choices[0].get("text")
            if piece:
                arrivals.append(now)
                text.append(str(piece))
        usage = event.get("usage")
        if isinstance(usage, dict):
            details = usage.get("prompt_tokens_details") or {}
            if isinstance(details.get("cached_tokens"), int):
                cached = int(details["cached_tokens"])
        if isinstance(event.get("timings"), dict):
            timings = event["timings"]
    end = time.perf_counter()
    ttft = ((first if first is not None else end) - started) * 1e3
    return HttpReply(ttft, arrivals, "".join(text), cached, timings)


class SseClient:
    """HTTP/1.1 to a server's base URL, a new connection per request (see the
    module's docstring); not thread-safe (one per stream)."""

    def __init__(self, base_url: str, timeout: float = 600.0) -> None:
        parts = urlsplit(base_url)
        if parts.hostname is None or parts.port is None:
            raise ValueError(f"not a base URL with a host and port: {base_url!r}")
        self.conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=timeout)

    def open(self) -> SseClient:
        """A new connection, now (untimed)."""
        self.conn.close()
        self.conn.connect()
        return self

    def close(self) -> None:
        self.conn.close()

    def __enter__(self) -> SseClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def complete(self, model: str, prompt: list[int], max_tokens: int) -> HttpReply:
        """One streamed ``/v1/completions`` (:func:`completion_body`), timed."""
        body = json.dumps(completion_body(model, prompt, max_tokens)).encode()
        headers = {"Content-Type": "application/json", "Accept": "text/event-stream"}
        self.open()
        started = time.perf_counter()
        # bytes: http.client sends the headers and the body in one write.
        self.conn.request("POST", "/v1/completions", body, headers)
        resp = self.conn.getresponse()
        if resp.status != 200:
            raise RuntimeError(f"/v1/completions: {resp.status} {resp.read()[:500]!r}")
        reply = read_events(resp, started)
        self.conn.close()
        return reply
