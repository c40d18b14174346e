"""The ``llamad`` commands served by a model's worker: complete, chat, embed, tokenize.

``complete`` and ``chat`` stream the reply to stdout as tokens arrive (the
public client's :meth:`~llamad.Client.infer`), and after each request print
on stderr how the cache served it. ``chat`` keeps the conversation: each
turn sends the whole chat through the model's template with the previous
turn's ``finish_key`` as ``parent_key``, so the worker restores the previous
turn's state and prefills only the new message.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Mapping, Sequence
from typing import Any, TextIO

from llamad.cli import render
from llamad.cli.connect import UsageError, parse_key, parse_options, pick_model
from llamad.client.sync import Client
from llamad.model.results import (
    Completion,
    DoneEvent,
    ThinkingEvent,
    TokenEvent,
    ToolCallEvent,
)

__all__ = ["add_commands"]

DEFAULT_MAX_TOKENS = 256
_CHAT_EXIT = frozenset({"/exit", "/quit"})
_CHAT_RESET = "/reset"


def _options(args: argparse.Namespace) -> dict[str, Any]:
    """The request options the command line gives (unset ones are the worker's defaults)."""
    options = parse_options(args.option)
    for name in ("temperature", "top_k", "top_p", "min_p", "seed", "grammar"):
        value = getattr(args, name)
        if value is not None:
            options[name] = value
    options.setdefault("max_tokens", args.max_tokens)
    if args.stop:
        options["stop"] = list(args.stop)
    if args.json_schema is not None:
        try:
            options["json_schema"] = json.loads(args.json_schema)
        except ValueError as exc:
            raise UsageError(f"--json-schema: not JSON: {exc}") from None
    return options


def _stream(
    client: Client,
    model: str,
    out: TextIO,
    *,
    prompt: str | None = None,
    messages: Sequence[Mapping[str, Any]] | None = None,
    **options: Any,
) -> Completion:
    """Run one request, writing its reply to ``out`` as it arrives; the Completion."""
    stream = client.infer(model, prompt, messages=messages, **options)
    completion: Completion | None = None
    ended_line = True
    with stream:
        for event in stream:
            if isinstance(event, TokenEvent) and event.text:
                out.write(event.text)
                out.flush()
                ended_line = event.text.endswith("\n")
            elif isinstance(event, ThinkingEvent):
                sys.stderr.write(event.text)
                sys.stderr.flush()
            elif isinstance(event, ToolCallEvent):
                out.write(f"\n[tool_call] {event.text}\n")
                ended_line = True
            elif isinstance(event, DoneEvent):
                completion = event.result
    if not ended_line:
        out.write("\n")
    out.flush()
    assert completion is not None, "a stream ends with its done event or raises"
    return completion


def _read_prompt(text: str | None) -> str:
    if text is not None and text != "-":
        return text
    if sys.stdin.isatty():
        raise UsageError("give a PROMPT (or pipe one on stdin, or '-')")
    return sys.stdin.read()


def complete(args: argparse.Namespace, client: Client) -> int:
    model = pick_model(client, args.model)
    prompt = _read_prompt(args.prompt)
    options = _options(args)
    if args.parent_key:
        options["parent_key"] = parse_key(args.parent_key)
    if args.session:
        options["session_id"] = args.session
    request: dict[str, Any] = {"prompt": prompt}
    if args.chat or args.system is not None:
        # The prompt as the user's message, rendered by the model's template.
        messages = [{"role": "user", "content": prompt}]
        if args.system is not None:
            messages.insert(0, {"role": "system", "content": args.system})
        request = {"messages": messages}
    if args.json:
        result = client.complete(model, **request, **options)
        sys.stdout.write(render.to_json(result))
        return 0
    result = _stream(client, model, sys.stdout, **request, **options)
    if not args.quiet:
        sys.stderr.write(render.completion_summary(result))
    return 0


def chat(args: argparse.Namespace, client: Client) -> int:
    """An interactive session: one user message per line of stdin (a pipe works too)."""
    model = pick_model(client, args.model)
    options = _options(args)
    interactive = sys.stdin.isatty()
    system = [{"role": "system", "content": args.system}] if args.system is not None else []
    messages: list[dict[str, Any]] = list(system)
    parent: bytes | None = None
    turn = 0
    if interactive:
        sys.stderr.write(f"chatting with {model}: one message per line; /reset, /exit\n")
    while True:
        if interactive:
            sys.stderr.write("> ")
            sys.stderr.flush()
        line = sys.stdin.readline()
        if not line:
            break
        text = line.rstrip("\n")
        if not text.strip():
            continue
        if text.strip() in _CHAT_EXIT:
            break
        if text.strip() == _CHAT_RESET:
            messages, parent, turn = list(system), None, 0
            sys.stderr.write("[conversation reset]\n")
            continue
        turn += 1
        asked = [*messages, {"role": "user", "content": text}]
        try:
            result = _stream(
                client, model, sys.stdout, messages=asked, parent_key=parent, **options
            )
        except KeyboardInterrupt:
            if not interactive:
                raise
            # Leaving the stream cancelled the request; the turn is dropped.
            sys.stderr.write("\n[interrupted: this turn is forgotten]\n")
            turn -= 1
            continue
        messages = [*asked, {"role": "assistant", "content": result.reply}]
        parent = result.finish_key
        if not args.quiet:
            sys.stderr.write(render.turn_summary(turn, result))
            sys.stderr.flush()
    return 0


def embed(args: argparse.Namespace, client: Client) -> int:
    model = pick_model(client, args.model)
    vector = client.embed(model, _read_prompt(args.text), normalize=not args.no_normalize)
    if args.json:
        body = {"model": model, "dimensions": len(vector), "embedding": vector}
        sys.stdout.write(render.to_json(body))
    else:
        sys.stdout.write(render.embedding_text(vector))
    return 0


def tokenize(args: argparse.Namespace, client: Client) -> int:
    model = pick_model(client, args.model)
    tokens = client.tokenize(model, _read_prompt(args.text), add_special=not args.no_special)
    pieces = None
    if args.pieces:
        pieces = [client.detokenize(model, [t]) for t in tokens]
    if args.json:
        body: dict[str, Any] = {"model": model, "count": len(tokens), "tokens": tokens}
        if pieces is not None:
            body["pieces"] = pieces
        sys.stdout.write(render.to_json(body))
    elif pieces is not None:
        rows = zip(tokens, map(repr, pieces), strict=True)
        sys.stdout.write(render.table(("TOKEN", "PIECE"), rows))
    else:
        sys.stdout.write(" ".join(map(str, tokens)) + "\n")
        sys.stderr.write(f"{len(tokens)} tokens\n")
    return 0


def _sampling(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--max-tokens",
        type=int,
        default=DEFAULT_MAX_TOKENS,
        metavar="N",
        help=f"tokens to generate at most (default {DEFAULT_MAX_TOKENS})",
    )
    p.add_argument("-t", "--temperature", type=float, metavar="T", help="0: greedy")
    p.add_argument("--top-k", type=int, metavar="K")
    p.add_argument("--top-p", type=float, metavar="P")
    p.add_argument("--min-p", type=float, metavar="P")
    p.add_argument("--seed", type=int, metavar="N")
    p.add_argument("--stop", action="append", metavar="TEXT", help="a stop string (repeatable)")
    p.add_argument("--grammar", metavar="GBNF", help="constrain the reply with a GBNF grammar")
    p.add_argument("--json-schema", metavar="JSON", help="constrain the reply to a JSON Schema")
    p.add_argument("--system", metavar="TEXT", help="a system message (implies the chat template)")
    p.add_argument(
        "-o",
        "--option",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="any other request option (repetition_penalty=1.1, logprobs=5, cache_salt=x...)",
    )
    p.add_argument("-q", "--quiet", action="store_true", help="no cache summary on stderr")


def add_commands(commands: Any, common: argparse.ArgumentParser) -> None:
    """Register the commands on ``commands`` (argparse's subparsers action)."""

    def command(name: str, help_: str, run: Any) -> argparse.ArgumentParser:
        p: argparse.ArgumentParser = commands.add_parser(
            name, help=help_, description=help_, parents=[common]
        )
        p.add_argument(
            "-m", "--model", metavar="MODEL", help="the model (default: the only one served)"
        )
        p.set_defaults(run=run, client=True)
        return p

    p = command("complete", "complete a prompt, streaming the reply to stdout", complete)
    p.add_argument("prompt", metavar="PROMPT", nargs="?", help="the prompt (default/'-': stdin)")
    p.add_argument(
        "--chat", action="store_true", help="send the prompt as a user message (chat template)"
    )
    p.add_argument("--parent-key", metavar="HEX", help="resume from a previous finish_key")
    p.add_argument("--session", metavar="ID", help="pin a sequence to this session id")
    p.add_argument(
        "--json", action="store_true", help="print the final Completion as JSON (no streaming)"
    )
    _sampling(p)

    p = command("chat", "an interactive multi-turn chat (one message per line of stdin)", chat)
    _sampling(p)

    p = command("embed", "the pooled embedding of a text", embed)
    p.add_argument("text", metavar="TEXT", nargs="?", help="the text (default/'-': stdin)")
    p.add_argument("--no-normalize", action="store_true", help="skip the L2 normalisation")
    p.add_argument("--json", action="store_true", help="print JSON for scripts")

    p = command("tokenize", "the model's tokens for a text", tokenize)
    p.add_argument("text", metavar="TEXT", nargs="?", help="the text (default/'-': stdin)")
    p.add_argument("--no-special", action="store_true", help="no BOS/special tokens added")
    p.add_argument("--pieces", action="store_true", help="show each token's text")
    p.add_argument("--json", action="store_true", help="print JSON for scripts")
