"""llama-cpp-python as a peer: a child process of its own venv (bench/peers_setup.py).

One child per cache kind: ``ram`` (``LlamaRAMCache``) or ``disk``
(``LlamaDiskCache`` in a private directory, which outlives the child, so a
new child is llama-cpp-python "after a restart"). The child times its own
requests (:mod:`bench.peers.lcpp_child`).
"""

from __future__ import annotations

import json
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

CHILD = Path(__file__).resolve().parent / "lcpp_child.py"


@dataclass
class LcppReply:
    ttft_ms: float
    arrivals: list[float]
    reused: int


class LlamaCppPython:
    def __init__(
        self,
        python: Path,
        model: str,
        *,
        n_ctx: int,
        threads: int,
        cache: str,
        cache_dir: Path,
        log: Path,
    ) -> None:
        self.python = python
        self.log_path = log
        self.config = {
            "model": model,
            "n_ctx": n_ctx,
            "threads": threads,
            "cache": cache,
            "cache_dir": str(cache_dir),
        }
        self.proc: subprocess.Popen[str] | None = None
        self.version = ""

    def start(self) -> None:
        # Its stderr (LlamaDiskCache prints every store there) goes to a log.
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(
                [str(self.python), str(CHILD), json.dumps(self.config)],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=log,
                text=True,
            )
        hello = self._read()
        self.version = str(hello.get("version", ""))

    def _pipes(self) -> tuple[IO[str], IO[str]]:
        assert self.proc is not None and self.proc.stdin and self.proc.stdout
        return self.proc.stdin, self.proc.stdout

    def _read(self) -> dict[str, Any]:
        _, out = self._pipes()
        line = out.readline()
        if not line:
            assert self.proc is not None
            tail = self.log_path.read_text(errors="replace")[-2000:]
            raise RuntimeError(f"llama-cpp-python child exited {self.proc.wait()}:\n{tail}")
        result: dict[str, Any] = json.loads(line)
        return result

    def complete(self, tokens: list[int], n: int, *, forget: bool) -> LcppReply:
        stdin, _ = self._pipes()
        stdin.write(json.dumps({"op": "complete", "tokens": tokens, "n": n, "forget": forget}))
        stdin.write("\n")
        stdin.flush()
        r = self._read()
        return LcppReply(float(r["ttft_ms"]), list(r["arrivals"]), int(r["reused"]))

    def stop(self) -> None:
        if self.proc is None:
            return
        proc, self.proc = self.proc, None
        try:
            assert proc.stdin is not None
            proc.stdin.write('{"op": "quit"}\n')
            proc.stdin.close()
            proc.wait(30)
        except (OSError, subprocess.TimeoutExpired):
            proc.kill()
            proc.wait()

    def restart(self) -> None:
        self.stop()
        self.start()

    def pids(self) -> list[int]:
        return [self.proc.pid] if self.proc is not None else []
