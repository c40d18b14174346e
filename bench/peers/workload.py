"""What every system is sent: prompts as token ids (the same ids for all), chats, agents."""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass

_TEXT = (
    "river stone lamp cloud paper garden mirror copper harbor winter signal orchard "
    "lantern meadow thunder canvas silver market bridge forest candle window ladder "
    "quarry violet engine sparrow granite compass velvet ember island tunnel beacon"
)
_WORDS = _TEXT.split()

Tokenize = Callable[[str], list[int]]


@dataclass(frozen=True)
class Sizes:
    """The run's scale: quick (develop on a busy machine) or full (SPEC's sizes)."""

    ttft: tuple[int, ...]
    decode_tokens: int
    agents_prefix: int
    agent_tail: int
    chat_turns: int
    chat_reply: int
    itl_prompt: int
    itl_tokens: int
    itl_interval: int
    # P14 (bench/peers/contention.py): each stream's time budget beside the
    # hogs and quiet, seconds.
    contention_s: float = 30.0
    contention_quiet_s: float = 10.0

    @classmethod
    def full(cls) -> Sizes:
        return cls((512, 1024, 2048), 128, 1024, 32, 6, 40, 640, 384, 64, 30.0, 10.0)

    @classmethod
    def quick(cls) -> Sizes:
        return cls((512,), 32, 512, 16, 6, 40, 560, 96, 32, 20.0, 5.0)


def words(nonce: str, n: int) -> str:
    """About ``n`` words drawn by the nonce; three of them lead, before the nonce
    itself, so two prompts rarely share even their first token (a prefix cache
    that takes any shared prefix, as llama-cpp-python's does, then finds nothing)."""
    rng = random.Random(nonce)
    lead = " ".join(rng.choice(_WORDS).capitalize() for _ in range(3))
    return f"{lead}, record {nonce}: " + " ".join(rng.choice(_WORDS) for _ in range(n))


def exact_tokens(tokenize: Tokenize, nonce: str, n: int) -> list[int]:
    """Exactly ``n`` token ids, the nonce first (no two nonces share a prefix row)."""
    text = words(nonce, n)
    ids = tokenize(text)
    while len(ids) < n:
        text += " " + words(nonce + "+", n)
        ids = tokenize(text)
    return ids[:n]


def counting_tokens(tokenize: Tokenize, start: int, n_numbers: int = 12) -> list[int]:
    """A prompt a greedy model continues for long (counting), so decode runs its length."""
    numbers = ", ".join(str(i) for i in range(start, start + n_numbers))
    return tokenize(f"Count upwards, one number after another, forever: {numbers},")


def long_counting_tokens(tokenize: Tokenize, start: int, at_least: int) -> list[int]:
    """A counting prompt of at least ``at_least`` tokens (long enough to be saved)."""
    n = 64
    ids = counting_tokens(tokenize, start, n)
    while len(ids) < at_least:
        n *= 2
        ids = counting_tokens(tokenize, start, n)
    return ids


def agent_tail(tokenize: Tokenize, nonce: str, i: int, n: int) -> list[int]:
    """Agent ``i``'s tail after a shared prefix: exactly ``n`` tokens (``tokenize``
    adds no special token), led by a word of its own, so the tails part from
    one another at their first token."""
    rng = random.Random(f"{nonce}-{i}")
    text = " " + " ".join(
        [_WORDS[i % len(_WORDS)], str(i), *(rng.choice(_WORDS) for _ in range(n))]
    )
    ids = tokenize(text)
    if len(ids) < n:
        raise ValueError(f"a tail of {len(ids)} tokens, wanted {n}")
    return ids[:n]


def chat_turn(nonce: str, turn: int) -> str:
    """The user's message of one turn: a short note and a question, about 30
    tokens (the report prints the run's mean)."""
    rng = random.Random(f"{nonce}-{turn}")
    note = " ".join(rng.choice(_WORDS) for _ in range(8))
    return f"Note {turn} ({nonce}): {note}. Which of these would you keep, and why?"
