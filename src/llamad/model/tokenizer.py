"""Text in and out of the served model: tokenize, detokenize, chat template (SPEC M11, L4, L8).

A :class:`Tokenizer` answers the worker's text ops from the loaded model
without touching its context, so the shell may run them between ticks at
any time. The chat template is the GGUF's own Jinja source rendered in the
binding's sandbox (:class:`~llamad.llama_ffi.ChatFormatter`, compiled once),
falling back to llama.cpp's built-in templates when the file has none.

Inputs are bounded here as well as by the message size: a prompt is refused
past :data:`MAX_TEXT_CHARS` characters and a detokenize past
:data:`MAX_DETOKENIZE_TOKENS` ids, with ``bad_request`` naming the field.

Thread-safe: the worker tokenizes long texts on a thread beside its loop
(:mod:`llamad.model.text_jobs`). llama.cpp's tokenizer only reads the
vocabulary (``llama_vocab::impl::tokenize`` is ``const`` and makes its own
session per call, as llama-server relies on when its HTTP threads tokenize
while the loop decodes), the model is leased for each call, and the Jinja
template renders in a fresh context each time.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Final

from llamad.errors import BadRequest
from llamad.llama_ffi.model import Model

if TYPE_CHECKING:
    from llamad.llama_ffi.chat_template import ChatFormatter

__all__ = ["MAX_DETOKENIZE_TOKENS", "MAX_TEXT_CHARS", "Tokenizer"]

MAX_TEXT_CHARS: Final = 16 << 20
"""Longest text tokenized in one call (characters); far beyond any context."""
MAX_DETOKENIZE_TOKENS: Final = 1 << 20


class Tokenizer:
    """The model's vocabulary and chat template, for the worker's text ops."""

    def __init__(self, model: Model) -> None:
        self.model = model
        self._formatter: ChatFormatter | None = None
        self._lock = threading.Lock()
        #: The most bytes of text one token stands for (``None``: no sound
        #: bound for this vocabulary); measured here, at load, not in a request.
        self.max_token_bytes: int | None = model.max_token_bytes

    @property
    def formatter(self) -> ChatFormatter:
        """The compiled chat template (made on first use: compiling costs ~ms).

        The chat modules (jinja2's sandbox, the tool-call parsers) are imported
        here and below, by the first chat request: a worker asked only for
        completions of text or tokens does not keep them resident (SPEC P9)."""
        from llamad.llama_ffi.chat_template import ChatFormatter  # noqa: PLC0415

        with self._lock:  # the loop and the text thread may both ask first
            if self._formatter is None:
                self._formatter = ChatFormatter.for_model(self.model)
            return self._formatter

    def tokenize(
        self, text: str, *, add_special: bool = True, parse_special: bool = False
    ) -> list[int]:
        """Token ids of ``text``; ``add_special`` adds BOS/EOS as the model asks,
        ``parse_special`` reads spelled-out special tokens (``<|im_start|>``) as theirs."""
        if not isinstance(text, str):
            raise BadRequest("text must be a string", details={"field": "text"})
        if len(text) > MAX_TEXT_CHARS:
            raise BadRequest(
                f"text is longer than {MAX_TEXT_CHARS} characters", details={"field": "text"}
            )
        return self.model.tokenize(text, add_special=add_special, parse_special=parse_special)

    def detokenize(
        self, tokens: Sequence[int], *, remove_special: bool = False, unparse_special: bool = True
    ) -> str:
        """Text of ``tokens`` (``invalid_token`` for an id outside the vocabulary).

        Special tokens render as their text by default (``unparse_special``), so
        ``detokenize(tokenize(t, parse_special=True))`` gives ``t`` back.
        """
        if isinstance(tokens, str | bytes) or not isinstance(tokens, Sequence):
            raise BadRequest("tokens must be a list of token ids", details={"field": "tokens"})
        if len(tokens) > MAX_DETOKENIZE_TOKENS:
            raise BadRequest(
                f"more than {MAX_DETOKENIZE_TOKENS} tokens", details={"field": "tokens"}
            )
        return self.model.detokenize(
            list(tokens), remove_special=remove_special, unparse_special=unparse_special
        )

    def render_chat(
        self,
        messages: object,
        *,
        add_generation_prompt: bool = True,
        tools: Sequence[Mapping[str, Any]] | None = None,
        enable_thinking: bool | None = None,
        **options: Any,
    ) -> str:
        """The prompt text the model's template makes of ``messages``
        (``template_error`` / ``template_security`` when the template fails)."""
        return self.formatter.render(
            messages,
            add_generation_prompt=add_generation_prompt,
            tools=tools,
            enable_thinking=enable_thinking,
            **options,
        )

    def chat_prompt(self, messages: object, **options: Any) -> tuple[str, bool]:
        """The prompt text of ``messages`` and whether BOS is added to it: what
        :meth:`apply_chat_template` tokenizes (with special tokens parsed)."""
        from llamad.llama_ffi.chat_template import chat_prompt  # noqa: PLC0415  (see formatter)

        return chat_prompt(self.model, messages, formatter=self.formatter, **options)

    def tool_grammar(self, tools: list[dict[str, Any]] | None, tool_choice: object) -> str | None:
        """The grammar for ``tool_choice`` ``required`` or named: one call in
        the format this model's prompt asks for
        (:func:`~llamad.llama_ffi.tool_calls.tool_call_grammar`)."""
        from llamad.llama_ffi.tool_calls import tool_call_grammar  # noqa: PLC0415  (see formatter)

        return tool_call_grammar(tools, tool_choice, self.formatter.tool_family)

    def apply_chat_template(
        self,
        messages: object,
        *,
        add_generation_prompt: bool = True,
        tools: Sequence[Mapping[str, Any]] | None = None,
        enable_thinking: bool | None = None,
        **options: Any,
    ) -> list[int]:
        """:meth:`render_chat`, tokenized with special tokens parsed (BOS only
        when the model wants one and the template did not write it)."""
        from llamad.llama_ffi.chat_template import apply_chat_template  # noqa: PLC0415

        return apply_chat_template(
            self.model,
            messages,
            formatter=self.formatter,
            add_generation_prompt=add_generation_prompt,
            tools=tools,
            enable_thinking=enable_thinking,
            **options,
        )
