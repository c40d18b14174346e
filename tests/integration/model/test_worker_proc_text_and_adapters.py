"""Text ops, embeddings and LoRA adapters through a real worker process (SPEC M11).

An adapter applies to the whole context at once, so the worker applies a change
only when it holds no request: a change that arrives while requests run waits
for them, and requests that arrive after it wait behind it.
"""

from __future__ import annotations

import json
import math
import threading
from pathlib import Path
from typing import Any

import pytest

from llamad.errors import BadRequest, SchemaError
from llamad.llama_ffi.errors import AdapterError
from llamad.llama_ffi.tool_calls import parse_tool_calls
from llamad.model.results import CacheHitKind, FinishReason, TokenEvent
from llamad.model.wire import ChatOptions
from llamad.model.worker_client import WorkerClient
from lora_gguf import write_lora
from worker_tree import WorkerTree, prompt_text, wait_until

pytestmark = [pytest.mark.model, pytest.mark.slow, pytest.mark.timeout(300)]

GREEDY = {"temperature": 0.0}
ENDLESS = 'root ::= "la " root'


#: This module's worker tree (the ``tree`` fixture, conftest.py).
TREE: dict[str, Any] = dict(n_seq_max=2, prefix="lma")


def test_text_round_trips_through_the_worker(worker: WorkerClient) -> None:
    text = "<|im_start|>user\nHello, world!<|im_end|>"
    tokens = worker.tokenize(text, add_special=False)
    assert worker.detokenize(tokens) == text
    chat = worker.apply_chat_template([{"role": "user", "content": "Hello, world!"}])
    assert worker.detokenize(chat).rstrip().endswith("<|im_start|>assistant")


def test_embeddings_are_unit_length_and_batched_like_alone(worker: WorkerClient) -> None:
    texts = ["a red apple", "the stock market", "a green pear"]
    both = worker.embed(texts)
    alone = [worker.embed([t])[0] for t in texts]
    for v, w in zip(both, alone, strict=True):
        assert math.isclose(math.fsum(x * x for x in v), 1.0, rel_tol=1e-3)
        assert max(abs(a - b) for a, b in zip(v, w, strict=True)) < 1e-3


CITY_TOOL: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather of a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "maxLength": 12}},
            "required": ["city"],
        },
    },
}
TIME_TOOL: dict[str, Any] = {"type": "function", "function": {"name": "get_time"}}
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]


def test_tool_choice_required_or_named_makes_the_small_model_call(worker: WorkerClient) -> None:
    # SmolLM2's template knows no tools: they go into the system message and
    # the grammar holds the 135M model to one Hermes-format call.
    tools = [CITY_TOOL, TIME_TOOL]
    for choice, names in [
        ("required", {"get_weather", "get_time"}),
        ({"type": "function", "function": {"name": "get_weather"}}, {"get_weather"}),
    ]:
        chat = ChatOptions(tools=tools, tool_choice=choice)
        done = worker.complete(messages=ASK, chat=chat, max_tokens=64, **GREEDY)
        assert done.finish_reason is FinishReason.STOP, done.reply  # the grammar ended it
        assert done.reply.startswith("<tool_call>\n")
        parsed = parse_tool_calls(done.reply, tools)
        assert len(parsed.calls) == 1 and parsed.content is None, done.reply
        call = parsed.calls[0]
        assert call.name in names
        arguments = json.loads(call.arguments)
        if call.name == "get_weather":
            assert isinstance(arguments["city"], str)
    # "none": the model is not told of the tools.
    plain = worker.apply_chat_template(ASK)
    assert worker.apply_chat_template(ASK, tools=tools, tool_choice="none") == plain
    assert len(worker.apply_chat_template(ASK, tools=tools)) > len(plain) + 50


def test_bad_tool_choices_are_refused_and_the_worker_serves_on(worker: WorkerClient) -> None:
    named = ChatOptions(
        tools=[TIME_TOOL], tool_choice={"type": "function", "function": {"name": "nope"}}
    )
    with pytest.raises(BadRequest, match="not among the tools"):
        worker.complete(messages=ASK, chat=named, max_tokens=4)
    required = ChatOptions(tools=[TIME_TOOL], tool_choice="required")
    with pytest.raises(BadRequest) as exc:
        worker.complete(messages=ASK, chat=required, grammar='root ::= "x"', max_tokens=4)
    assert exc.value.details["field"] == "tool_choice"
    bad = {"type": "function", "function": {"name": "f", "parameters": {"type": "nope"}}}
    with pytest.raises(SchemaError):
        worker.complete(
            messages=ASK, chat=ChatOptions(tools=[bad], tool_choice="required"), max_tokens=4
        )
    with pytest.raises(BadRequest):
        ChatOptions(tool_choice="required")  # no tools


def test_adapter_splits_the_namespace_and_unloading_joins_it_again(
    tree: WorkerTree, worker: WorkerClient, tmp_path: Path
) -> None:
    prompt = prompt_text(40)
    base = worker.complete(prompt, max_tokens=4, **GREEDY)
    tree.wait_saved(base.finish_key)
    info: Any = worker.actor.call(
        "load_adapter", {"path": str(write_lora(tmp_path / "s.gguf", seed=3)), "name": "style"}
    )
    assert info["name"] == "style" and info["scale"] == 1.0
    assert [a["name"] for a in worker.actor.call("list_adapters", {})] == ["style"]
    with pytest.raises(AdapterError):
        worker.actor.call("load_adapter", {"path": str(tmp_path / "s.gguf"), "name": "style"})
    styled = worker.complete(prompt, max_tokens=4, **GREEDY)
    assert styled.cache_hit_kind is CacheHitKind.COLD  # another namespace: no row
    worker.actor.call("unload_adapter", {"name": "style"})
    again = worker.complete(prompt, max_tokens=4, **GREEDY)
    assert again.cache_hit_kind is CacheHitKind.EXACT
    assert again.generated == base.generated


def test_adapter_change_waits_for_running_requests_and_holds_later_ones(
    tree: WorkerTree, worker: WorkerClient, tmp_path: Path
) -> None:
    lora = str(write_lora(tmp_path / "w.gguf", seed=4))
    finished: set[str] = set()
    results: dict[str, Any] = {}
    errors: list[BaseException] = []

    def call(name: str, fn: Any) -> None:
        try:
            with tree.client() as c:
                results[name] = fn(c)
            finished.add(name)
        except BaseException as exc:
            errors.append(exc)

    later_prompt = prompt_text(42)
    stream = worker.infer(prompt_text(41), max_tokens=60, grammar=ENDLESS, **GREEDY)
    events = iter(stream)
    assert isinstance(next(events), TokenEvent)  # running: the change must wait
    watcher = tree.client()
    change = threading.Thread(
        target=call,
        args=("change", lambda c: c.actor.call("load_adapter", {"path": lora, "name": "w"})),
    )
    change.start()
    wait_until(lambda: _open_requests(watcher) >= 2, "the change to wait beside the stream")
    later = threading.Thread(
        target=call,
        args=("later", lambda c: c.complete(later_prompt, max_tokens=2, **GREEDY)),
    )
    later.start()
    # The stream, the deferred change and the held request are all open at
    # once: the change did not go ahead of the running stream.
    wait_until(lambda: _open_requests(watcher) >= 3, "the later request to be held")
    assert not finished & {"change", "later"}
    for _ in events:
        pass
    change.join(120)
    later.join(120)
    assert not errors, errors
    assert finished == {"change", "later"}
    # The held request ran under the adapter, so after the change: without the
    # adapter its prompt has no row of its own (admitted at once, it would have
    # run beside the stream in the base namespace and this would be an exact
    # hit). Judged by the worker's own namespaces, not by thread wake-up times.
    tree.wait_saved(results["later"].finish_key)
    worker.actor.call("unload_adapter", {"name": "w"})
    base = worker.complete(later_prompt, max_tokens=2, **GREEDY)
    assert base.cache_hit_kind is not CacheHitKind.EXACT


def _open_requests(watcher: WorkerClient) -> int:
    """Requests open on the worker's actor (streams and deferred replies)."""
    info: Any = watcher.actor.call("$info", {})
    return int(info["open"])
