"""The model worker's ops and their wire schemas, declared once (SPEC M7-M12).

Every op body is a frozen msgspec Struct (unknown fields refused, sizes
bounded), decoded and checked by the actor runtime before a handler runs; a
bad body is answered with ``bad_request`` naming the field and the worker
goes on. Request parameters are :class:`~llamad.model.requests.RequestParams`
and results are :mod:`llamad.model.results` types, as the core produces them.

=====================  ======  ===================================  ==========================
op                     kind    body                                 answer
=====================  ======  ===================================  ==========================
``infer``              stream  :class:`InferBody`                   events: ``token`` /
                                                                    ``thinking`` / ``tool_call``
                                                                    (:data:`~llamad.model.results.Event`);
                                                                    END: :class:`Completion`;
                                                                    or ERROR (typed)
``complete``           call    :class:`InferBody`                   :class:`Completion`
``prefill_only``       call    :class:`InferBody`                   :class:`Completion`
``cancel``             call    :class:`CancelBody`                  :class:`CancelReply`
``end_session``        call    :class:`SessionBody`                 ``None``
``reset_session``      call    :class:`SessionBody`                 ``None``
``fork_session``       call    :class:`ForkBody`                    :class:`ForkReply`
``status``             call    :class:`NoArgs`                      :class:`WorkerSnapshot`
``tokenize``           call    :class:`TokenizeBody`                :class:`TokensReply`
``detokenize``         call    :class:`DetokenizeBody`              :class:`TextReply`
``apply_chat_template`` call   :class:`ChatBody`                    :class:`TokensReply`
``embed``              call    :class:`EmbedBody`                   :class:`EmbedReply`
``load_adapter``       call    :class:`LoadAdapterBody`             :class:`AdapterInfo`
``unload_adapter``     call    :class:`AdapterRef`                  ``None``
``set_adapter_scale``  call    :class:`AdapterScaleBody`            :class:`AdapterInfo`
``list_adapters``      call    :class:`NoArgs`                      ``list[AdapterInfo]``
=====================  ======  ===================================  ==========================

A prompt is text (``prompt: str``, tokenized with the model's special tokens
parsed), token ids (``prompt: list[int]``) or a chat (``messages``, rendered
through the model's chat template with :class:`ChatOptions`); exactly one.
"""

from __future__ import annotations

from typing import Annotated, Any, Final

import msgspec

from llamad.actors.ops import NoArgs, OpKind, OpSpec
from llamad.errors import BadRequest
from llamad.llama_ffi.spin import SpinSetting
from llamad.model.requests import MAX_ID_CHARS, MAX_TOKENS_LIMIT, RequestParams
from llamad.model.results import WorkerStatus

__all__ = [
    "OPS",
    "AdapterInfo",
    "AdapterRef",
    "AdapterScaleBody",
    "CancelBody",
    "CancelReply",
    "ChatBody",
    "ChatOptions",
    "CollapseReport",
    "DetokenizeBody",
    "EmbedBody",
    "EmbedReply",
    "ForkBody",
    "ForkReply",
    "InferBody",
    "LatencyCounts",
    "LoadAdapterBody",
    "NoArgs",
    "SessionBody",
    "TextReply",
    "ThreadStatus",
    "TokenizeBody",
    "TokensReply",
    "WorkerMetrics",
    "WorkerSnapshot",
]

MAX_PROMPT_TOKENS: Final = MAX_TOKENS_LIMIT
MAX_TEXT_CHARS: Final = 16 << 20
MAX_MESSAGES: Final = 4096
MAX_EMBED_INPUTS: Final = 256

Id = Annotated[str, msgspec.Meta(min_length=1, max_length=MAX_ID_CHARS)]
Tokens = Annotated[list[int], msgspec.Meta(max_length=MAX_PROMPT_TOKENS)]
Text = Annotated[str, msgspec.Meta(max_length=MAX_TEXT_CHARS)]
Messages = Annotated[list[dict[str, Any]], msgspec.Meta(min_length=1, max_length=MAX_MESSAGES)]


class CollapseReport(msgspec.Struct, frozen=True):
    """The last collapsing step: its thread count, rows, KV cells, time and
    the median it was judged against, and how long ago it happened."""

    threads: int
    rows: int
    step_ms: float
    median_ms: float
    age_s: float
    kv_cells: int = 0


class ThreadStatus(msgspec.Struct, frozen=True):
    """What a worker reports about its threads in ``status``.

    ``threads``: the count the last step ran on. ``budget``: the most the
    daemon-wide budget allows now (``min(max_threads, cores // busy_workers)``).
    ``ceiling``: the most collapse fallback allows (``max_threads`` unless
    ``fallback``). ``fallbacks``: times the ceiling was lowered;
    ``collapses``: collapsing steps seen (also at 1 thread, where there is
    nothing to fall back to); ``probes``/``probes_kept``: attempts to go back
    up and how many held; ``explorations``/``explorations_kept``: tries of
    fewer threads without a collapse, and how many were faster (each kept one
    is also a fallback). ``next_probe_s``: seconds until the next probe up
    while falling back. ``quiet_probes``: probes up made before their
    cool-down ended, the other processes having left the cores free.
    """

    threads: int
    max_threads: int
    cores: int
    busy_workers: int
    budget: int
    ceiling: int
    fallback: bool
    fallbacks: int
    collapses: int
    probes: int
    probes_kept: int
    explorations: int
    explorations_kept: int
    cooldown_s: float
    next_probe_s: float | None
    last_collapse: CollapseReport | None
    quiet_probes: int = 0
    """Probes brought forward because the other work had gone (``cpu_load``)."""
    beside_own_work: int = 0
    """Steps neither judged nor learnt from because the daemon's own work (the
    worker's saves, cache-meta's copies) ran beside them (``ThreadGovernor``'s
    ``own_work``)."""
    halved_beside_own_work: int = 0
    """Short steps run on half the threads because the daemon's own work
    held cores as they started."""
    bursts: int = 0
    """Short steps that collapsed alone: the next step ran as usual, so the
    ceiling stayed (another process's burst, not a collapse)."""


class LatencyCounts(msgspec.Struct, frozen=True, array_like=True):
    """One latency histogram of a worker: observations per bucket (the bounds
    are :data:`llamad.model.request_metrics.BUCKETS`; the last bucket is
    above every bound) and their sum in seconds. Compact on the board."""

    counts: list[int]
    sum: float


class WorkerMetrics(msgspec.Struct, frozen=True):
    """What a worker counted since it started (:mod:`llamad.model.request_metrics`).

    ``outcomes``: requests by how they ended (``stop``, ``length``,
    ``cancelled``, ``error``, ``refused``). ``cache_hits``: requests by how
    their start was obtained (a :class:`~llamad.model.results.CacheHitKind`
    value: ``exact``, ``partial``, ``cold``, ``sticky``, ``continuation``).
    ``prompt_tokens``: prompt tokens by where their KV came from (a
    :class:`~llamad.model.results.TokenSource` value). ``generation_tokens``:
    tokens sampled. ``ttft``, ``itl``, ``e2e``, ``queue``: time to first
    token, between tokens, to the end, and to admission.
    """

    outcomes: dict[str, int]
    cache_hits: dict[str, int]
    prompt_tokens: dict[str, int]
    generation_tokens: int
    ttft: LatencyCounts
    itl: LatencyCounts
    e2e: LatencyCounts
    queue: LatencyCounts


class WorkerSnapshot(msgspec.Struct, frozen=True):
    """What a worker looks like from outside (SPEC M10).

    ``at``: when it was published, and ``busy_since``: when the tick in
    progress began (``None`` between ticks), both on the host's monotonic
    clock (``time.monotonic()`` is system-wide on Linux), so a reader can
    tell how long the current tick has run. ``generated_per_s``: sampled
    tokens per second, ``rows_per_s``: tokens decoded per second (prompt and
    generated), both over the last few seconds; ``last_tick_ms``: the last
    decode's duration; ``requests_total``: requests admitted since start.

    ``last_request_at``: when the worker last had a request (an op other than
    ``status`` handled, or a tick with a request admitted or queued), on the
    same monotonic clock; ``None`` before the first. The daemon's front
    unloads a model idle for its ``keep_alive`` from it (SPEC D7).

    ``tokenizing``: long texts the worker's text thread is rendering or
    tokenizing, or holds to do next (:mod:`llamad.model.text_jobs`).

    ``threads`` (SPEC M14): the thread governor's
    :class:`ThreadStatus` (the last step's count, the
    daemon-wide budget and busy workers, collapses, fallbacks, probes), or
    ``None`` for a worker whose threads are not governed. ``spin``: whether
    libgomp's barrier spin is bounded in this worker
    (:class:`~llamad.llama_ffi.spin.SpinSetting`: ``bounded``, ``operator``,
    ``too_late``, ``not_yet`` before libllama is loaded).

    ``metrics``: the worker's request counts and latency histograms since it
    started (:class:`WorkerMetrics`; ``None`` from a worker that keeps none).
    """

    model_id: str
    pid: int
    instance: str
    seq: int
    at: float
    status: WorkerStatus
    busy_since: float | None = None
    generated_per_s: float = 0.0
    rows_per_s: float = 0.0
    last_tick_ms: float = 0.0
    requests_total: int = 0
    threads: ThreadStatus | None = None
    spin: SpinSetting = SpinSetting.NOT_YET
    last_request_at: float | None = None
    tokenizing: int = 0
    metrics: WorkerMetrics | None = None


_TOOL_CHOICES: Final = ("none", "auto", "required")


class ChatOptions(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """How ``messages`` are rendered (the chat template's own switches).

    ``tools``: OpenAI function tools, rendered by the template (or, for one
    that knows no tools, written into the system message).
    ``tool_choice``: ``"none"`` (the tools are not rendered), ``"auto"``
    (the default), ``"required"`` or ``{"type": "function", "function":
    {"name": ...}}``: the worker then constrains generation by a grammar to
    one call in the template's tool-call format (a request that also gives
    ``grammar`` or ``json_schema`` is refused). The worker checks the named
    function is among the tools.
    """

    add_generation_prompt: bool = True
    continue_final_message: bool = False
    tools: list[dict[str, Any]] | None = None
    enable_thinking: bool | None = None
    system: str | None = None
    tool_choice: str | dict[str, Any] | None = None

    def __post_init__(self) -> None:
        choice = self.tool_choice
        if isinstance(choice, str) and choice not in _TOOL_CHOICES:
            raise BadRequest(
                f"tool_choice must be one of {', '.join(_TOOL_CHOICES)} or a named function,"
                f" not {choice!r}",
                details={"field": "tool_choice"},
            )
        if choice is not None and choice not in ("none", "auto") and not self.tools:
            raise BadRequest(
                "tool_choice required or named needs tools", details={"field": "tool_choice"}
            )


class InferBody(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """``infer``, ``complete``, ``prefill_only``: a prompt and its parameters.

    ``request_id`` names the request for ``cancel`` from another connection
    (unique among the worker's running requests; ``None``: the worker makes
    one). ``add_special``: whether a text prompt gets the model's BOS.
    ``sent_at``: the client's ``time.monotonic()`` when it sent the request;
    a worker on the same host counts the request's ``queue_ms`` from it (the
    wait for a tick already running when it arrived, routing, transport),
    and ignores it from another host or when it is not a plausible past time.
    """

    prompt: Text | Tokens | None = None
    messages: Messages | None = None
    params: RequestParams = RequestParams()
    chat: ChatOptions = ChatOptions()
    request_id: Id | None = None
    add_special: bool = True
    sent_at: float | None = None

    def __post_init__(self) -> None:
        if (self.prompt is None) == (self.messages is None):
            raise BadRequest(
                "give exactly one of prompt (text or tokens) and messages",
                details={"field": "prompt"},
            )


class CancelBody(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    request_id: Id


class CancelReply(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    cancelled: bool
    """False when no such request was running (already finished, or unknown)."""


class SessionBody(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    session_id: Id


class ForkBody(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    source_id: Id
    new_id: Id


class ForkReply(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    copied: bool
    """True: the KV was copied into a free sequence; False: the fork starts
    parked and its first request restores or prefills its transcript."""


class TokenizeBody(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    text: Text
    add_special: bool = True
    parse_special: bool = True


class TokensReply(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    tokens: list[int]


class DetokenizeBody(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    tokens: Tokens
    remove_special: bool = False
    unparse_special: bool = True


class TextReply(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    text: str


class ChatBody(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """``apply_chat_template``: the prompt tokens a chat renders to."""

    messages: Messages
    chat: ChatOptions = ChatOptions()


class EmbedBody(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """``embed``: one vector per input (text or token ids)."""

    inputs: Annotated[list[Text | Tokens], msgspec.Meta(min_length=1, max_length=MAX_EMBED_INPUTS)]
    normalize: bool = True


class EmbedReply(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    embeddings: list[list[float]]


class LoadAdapterBody(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    path: Annotated[str, msgspec.Meta(min_length=1, max_length=4096)]
    scale: float = 1.0
    name: Id | None = None


class AdapterRef(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    name: Id


class AdapterScaleBody(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    name: Id
    scale: float


class AdapterInfo(msgspec.Struct, frozen=True):
    """One LoRA adapter loaded on a worker (name, file, digest, scale): the
    answer of ``load_adapter`` and ``set_adapter_scale``, an item of
    ``list_adapters``.

    Here, not beside the code that loads adapters
    (:mod:`llamad.model.adapters`, which loads libllama), so that a client
    decodes the worker's own type.
    """

    name: str
    path: str
    sha256: str
    """Hex digest of the adapter file as it was loaded."""
    scale: float
    """0 keeps it loaded but out of the graph (and out of the namespace)."""


def _call(name: str, body: Any, doc: str) -> OpSpec:
    return OpSpec(name, OpKind.CALL, body=body, doc=doc)


OPS: Final[dict[str, OpSpec]] = {
    spec.name: spec
    for spec in (
        OpSpec(
            "infer",
            OpKind.STREAM,
            body=InferBody,
            doc="generate: token/thinking/tool_call events, END with the Completion",
        ),
        _call("complete", InferBody, "generate; the Completion"),
        _call("prefill_only", InferBody, "warm the cache with the prompt; the Completion"),
        _call("cancel", CancelBody, "cancel a running request by id"),
        _call("end_session", SessionBody, "forget a session, free its sequence"),
        _call("reset_session", SessionBody, "empty a session's transcript and KV"),
        _call("fork_session", ForkBody, "copy a session into a new one"),
        _call("status", NoArgs, "the worker's last published snapshot"),
        _call("tokenize", TokenizeBody, "text to token ids"),
        _call("detokenize", DetokenizeBody, "token ids to text"),
        _call("apply_chat_template", ChatBody, "a chat to prompt token ids"),
        _call("embed", EmbedBody, "pooled embeddings"),
        _call("load_adapter", LoadAdapterBody, "load and attach a LoRA adapter"),
        _call("unload_adapter", AdapterRef, "detach and free a LoRA adapter"),
        _call("set_adapter_scale", AdapterScaleBody, "change an adapter's scale"),
        _call("list_adapters", NoArgs, "attached adapters"),
    )
}
