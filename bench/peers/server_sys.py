"""llama-server as a peer: built from the same pinned tree, driven over HTTP.

Started with the context llamad's models get: ``-c n_ctx``, ``-np n_seq_max``
with one unified KV buffer (``--kv-unified``: llamad's sequences share their
cells the same way; without it each slot would get ``n_ctx / np`` cells),
``-t`` / ``-tb`` = the bench's threads, flash attention ``auto`` (both
defaults), its prompt cache on (``--cache-prompt``), its host-RAM prompt cache
(``--cache-ram``) and idle slots saved to it on a new task
(``--cache-idle-slots``), so a repeated prompt whose slot was taken is
served from host RAM.

Requests go to ``/completion`` with the prompt as token ids (the same ids
llamad gets), greedy, streamed (Server-Sent Events) so the first token's
arrival is timed on the client. The last event's ``timings.cache_n`` is how
many prompt tokens the server reports it reused.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import re
import signal
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

READY_TIMEOUT_S = 240.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Reply:
    """One streamed request: first token (ms, client side), token arrivals, timings."""

    ttft_ms: float
    arrivals: list[float]
    timings: dict[str, Any]
    content: str
    slot: int | None = None  # the slot that served it (``id_slot``)


class LlamaServer:
    def __init__(
        self, binary: str, model: str, *, n_ctx: int, n_seq_max: int, threads: int, log: Path
    ) -> None:
        self.binary = binary
        self.model = model
        self.port = free_port()
        self.args = [
            binary,
            "-m",
            model,
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "-c",
            str(n_ctx),
            "-np",
            str(n_seq_max),
            "--kv-unified",
            "-t",
            str(threads),
            "-tb",
            str(threads),
            "--cache-prompt",
            "--cache-ram",
            "2048",
            "--cache-idle-slots",
            "--no-webui",
        ]
        self.log_path = log
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(
                self.args, stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True
            )
        deadline = time.monotonic() + READY_TIMEOUT_S
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"llama-server exited {self.proc.returncode}:\n{self.log_tail()}"
                )
            with contextlib.suppress(OSError, ValueError):
                status, _ = self._get("/health")
                if status == 200:
                    return
            if time.monotonic() > deadline:
                raise RuntimeError("llama-server not ready in time")
            time.sleep(0.1)

    def stop(self) -> None:
        if self.proc is None:
            return
        proc, self.proc = self.proc, None
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()

    def restart(self) -> None:
        self.stop()
        self.start()

    def pids(self) -> list[int]:
        return [self.proc.pid] if self.proc is not None else []

    def log_tail(self, lines: int = 30) -> str:
        text = self.log_path.read_text(errors="replace") if self.log_path.exists() else ""
        return "\n".join(text.splitlines()[-lines:])

    def buffers_mib(self) -> dict[str, float]:
        """Weights and KV as the server logged them (MiB): ``model`` (every
        ``model buffer size`` line: the mapped weights and CPU_REPACK copies)
        and ``kv`` (the KV cache's size)."""
        text = self.log_path.read_text(errors="replace") if self.log_path.exists() else ""
        model = sum(float(m) for m in re.findall(r"model buffer size\s*=\s*([\d.]+) MiB", text))
        kv = re.findall(r"llama_kv_cache:\s+size\s*=\s*([\d.]+) MiB", text)
        if not kv:
            kv = re.findall(r"KV buffer size\s*=\s*([\d.]+) MiB", text)
        return {"model": model, "kv": float(kv[-1]) if kv else 0.0}

    # -- HTTP --------------------------------------------------------------------------

    def _get(self, path: str) -> tuple[int, bytes]:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=5)
        try:
            conn.request("GET", path)
            resp = conn.getresponse()
            return resp.status, resp.read()
        finally:
            conn.close()

    def complete(self, prompt: list[int], n_predict: int, *, ignore_eos: bool = False) -> Reply:
        """One greedy streamed ``/completion``; its first token's arrival on the client."""
        body = json.dumps(
            {
                "prompt": prompt,
                "n_predict": n_predict,
                "temperature": 0.0,
                "stream": True,
                "cache_prompt": True,
                "ignore_eos": ignore_eos,
            }
        ).encode()
        return self._stream("/completion", body)

    def chat(self, messages: list[dict[str, str]], max_tokens: int) -> Reply:
        """One greedy streamed chat completion through the model's chat template."""
        body = json.dumps(
            {
                "messages": messages,
                "max_tokens": max_tokens,
                "temperature": 0.0,
                "stream": True,
                "cache_prompt": True,
                "timings_per_token": False,
            }
        ).encode()
        return self._stream("/v1/chat/completions", body)

    def _stream(self, path: str, body: bytes) -> Reply:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=600)
        try:
            started = time.perf_counter()
            conn.request("POST", path, body, {"Content-Type": "application/json"})
            resp = conn.getresponse()
            if resp.status != 200:
                raise RuntimeError(f"llama-server {path}: {resp.status} {resp.read()[:500]!r}")
            arrivals: list[float] = []
            timings: dict[str, Any] = {}
            slot: int | None = None
            text: list[str] = []
            for raw in resp:
                line = raw.strip()
                if not line.startswith(b"data:"):
                    continue
                data = line[5:].strip()
                if data == b"[DONE]":
                    break
                event = json.loads(data)
                piece = _piece(event)
                if piece is not None:
                    arrivals.append(time.perf_counter())
                    text.append(piece)
                if "timings" in event:
                    timings = event["timings"]
                if isinstance(event.get("id_slot"), int):
                    slot = event["id_slot"]
                if event.get("stop") is True and path == "/completion":
                    break
            ttft = ((arrivals[0] if arrivals else time.perf_counter()) - started) * 1e3
            return Reply(ttft, arrivals, timings, "".join(text), slot)
        finally:
            conn.close()


def _piece(event: dict[str, Any]) -> str | None:
    """The text a streamed event carries for one sampled token, else None."""
    if "content" in event and event.get("stop") is not True:
        return str(event["content"])
    choices = event.get("choices")
    if choices:
        delta = choices[0].get("delta") or {}
        content = delta.get("content")
        if content is not None:
            return str(content)
    return None
