"""A loaded GGUF model: load options, introspection, metadata, the tokenizer.

A :class:`Model` owns one ``llama_model``. Contexts, samplers and adapters
lease it, so :meth:`Model.close` frees the weights only once the last of them
is gone; every call after close raises :class:`~llamad.llama_ffi.errors.Closed`.
"""

from __future__ import annotations

import functools
import os
import weakref
from collections.abc import Callable, Sequence
from typing import Any

import structlog

from llamad.errors import BadRequest
from llamad.llama_ffi import vocab as _vocab
from llamad.llama_ffi.context import Context
from llamad.llama_ffi.errors import Closed, LoadCancelled, ModelLoadError
from llamad.llama_ffi.gguf_check import check_gguf
from llamad.llama_ffi.inputs import c_string, file_path
from llamad.llama_ffi.lifetime import NativeHandle
from llamad.llama_ffi.lora import LoraAdapter
from llamad.llama_ffi.native import ensure_backend, ffi, lib, read_metadata, read_string
from llamad.llama_ffi.options import ContextOptions, ModelOptions

__all__ = ["Model", "ProgressCallback"]

log = structlog.get_logger("llamad.llama_ffi")

ProgressCallback = Callable[[float], "bool | None"]
"""Called with load progress in [0, 1]; returning ``False`` cancels the load."""


class _Progress:
    __slots__ = ("callback", "cancelled", "error")

    def __init__(self, callback: ProgressCallback) -> None:
        self.callback = callback
        self.error: BaseException | None = None
        self.cancelled = False


@ffi.def_extern(onerror=lambda *_: False)  # type: ignore[untyped-decorator]
def _llamad_progress_cb(progress: float, user_data: Any) -> bool:
    state: _Progress = ffi.from_handle(user_data)
    try:
        keep_going = state.callback(float(progress)) is not False
    except BaseException as exc:
        # Never let an exception unwind into llama.cpp: stop the load and
        # re-raise it in the loading thread.
        state.error = exc
        return False
    if not keep_going:
        state.cancelled = True
    return keep_going


class Model:
    """A GGUF model loaded with :class:`ModelOptions` (SPEC L2).

    ``progress`` receives the load fraction; returning ``False`` (or raising)
    cancels the load. The file is checked to be a complete GGUF before
    llama.cpp opens it.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        options: ModelOptions | None = None,
        *,
        progress: ProgressCallback | None = None,
    ) -> None:
        self.path = file_path(path)
        self.options = options or ModelOptions()
        info = check_gguf(self.path)
        self.file_identity: tuple[int, int, int, int] = info.file_identity
        """``(st_dev, st_ino, st_size, st_mtime_ns)`` of the file as it was loaded:
        whoever hashes the file later can check it is still the one in memory."""
        ensure_backend()

        params = lib.llama_model_default_params()
        opts = self.options
        params.n_gpu_layers = opts.n_gpu_layers
        params.load_mode = int(opts.load_mode)
        params.split_mode = int(opts.split_mode)
        params.main_gpu = opts.main_gpu
        params.vocab_only = opts.vocab_only
        params.check_tensors = opts.check_tensors
        params.use_extra_bufts = opts.repack
        keep: list[Any] = []
        if opts.tensor_split:
            split = ffi.new("float[]", int(lib.llama_max_devices()))
            for i, share in enumerate(opts.tensor_split):
                split[i] = share
            params.tensor_split = split
            keep.append(split)
        state = _Progress(progress) if progress is not None else None
        if state is not None:
            handle = ffi.new_handle(state)
            keep.append(handle)
            params.progress_callback = lib._llamad_progress_cb
            params.progress_callback_user_data = handle

        ptr = lib.llama_model_load_from_file(os.fsencode(self.path), params)
        del keep
        if state is not None and state.error is not None:
            if ptr != ffi.NULL:
                lib.llama_model_free(ptr)
            raise state.error
        if ptr == ffi.NULL:
            if state is not None and state.cancelled:
                raise LoadCancelled(f"loading {self.path} was cancelled by the progress callback")
            raise ModelLoadError(
                f"llama.cpp failed to load {self.path} (see llama.log events)",
                details={"path": str(self.path)},
            )

        self._handle = NativeHandle(ptr, _model_free(str(self.path)), f"model {self.path.name}")
        self._vocab = lib.llama_model_get_vocab(ptr)
        # Weak: adapters and contexts lease the model, never the other way round.
        self._adapters: weakref.WeakSet[LoraAdapter] = weakref.WeakSet()
        self._contexts: weakref.WeakSet[Context] = weakref.WeakSet()
        self._finalizer = weakref.finalize(self, self._handle.close)
        self._metadata: dict[str, str] | None = None
        self._eog: frozenset[int] | None = None
        self._max_token_bytes: int | None = -1  # -1: not measured yet

        self.n_vocab = int(lib.llama_vocab_n_tokens(self._vocab))
        self.n_ctx_train = int(lib.llama_model_n_ctx_train(ptr))
        self.n_embd = int(lib.llama_model_n_embd(ptr))
        self.n_layer = int(lib.llama_model_n_layer(ptr))
        # llama.cpp aborts on per-layer queries of a model without layers
        # (vocab_only): only ask when there is a layer 0.
        has_layers = self.n_layer > 0
        self.n_head = int(lib.llama_model_n_head(ptr)) if has_layers else 0
        self.n_head_kv = int(lib.llama_model_n_head_kv(ptr)) if has_layers else 0
        self.size = int(lib.llama_model_size(ptr))
        self.n_params = int(lib.llama_model_n_params(ptr))
        self.ftype = int(lib.llama_model_ftype(ptr))
        self.ftype_name = ffi.string(lib.llama_ftype_name(self.ftype)).decode()
        self.description = read_string(functools.partial(lib.llama_model_desc, ptr)) or ""
        self.bos = _token_or_none(lib.llama_vocab_bos(self._vocab))
        self.eos = _token_or_none(lib.llama_vocab_eos(self._vocab))
        self.eot = _token_or_none(lib.llama_vocab_eot(self._vocab))
        self.nl = _token_or_none(lib.llama_vocab_nl(self._vocab))
        self.pad = _token_or_none(lib.llama_vocab_pad(self._vocab))
        self.add_bos = bool(lib.llama_vocab_get_add_bos(self._vocab))
        self.add_eos = bool(lib.llama_vocab_get_add_eos(self._vocab))
        self.is_recurrent = bool(lib.llama_model_is_recurrent(ptr))
        log.info(
            "model.loaded",
            path=str(self.path),
            description=self.description,
            n_params=self.n_params,
            vocab_only=opts.vocab_only,
        )

    # -- lifetime -----------------------------------------------------------------

    def close(self) -> None:
        """Release the model; the free waits for the last context/sampler/adapter user."""
        self._handle.close()

    @property
    def closed(self) -> bool:
        return self._handle.closed

    @property
    def native_handle(self) -> NativeHandle:
        """The lease-counted ``llama_model*`` (for the binding's own types)."""
        return self._handle

    def __enter__(self) -> Model:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self.closed else "open"
        return f"<Model {self.path.name} {self.description!r} {state}>"

    def _check_open(self) -> None:
        if self._handle.closed:
            raise Closed(f"{self._handle.what} is closed")

    # -- introspection ---------------------------------------------------------

    @property
    def metadata(self) -> dict[str, str]:
        """GGUF metadata key/values as strings (array values are not included)."""
        if self._metadata is None:
            with self._handle.lease() as ptr:
                self._metadata = read_metadata(
                    ptr,
                    lib.llama_model_meta_count,
                    lib.llama_model_meta_key_by_index,
                    lib.llama_model_meta_val_str_by_index,
                )
        self._check_open()
        return dict(self._metadata)

    def meta(self, key: str) -> str | None:
        """One metadata value, or None if the key is absent."""
        return self.metadata.get(key)

    def chat_template(self, name: str | None = None) -> str | None:
        """The GGUF's chat template (``tokenizer.chat_template[.name]``), if any."""
        encoded = None if name is None else c_string(name, "name")
        with self._handle.lease() as ptr:
            raw = lib.llama_model_chat_template(ptr, ffi.NULL if encoded is None else encoded)
            if raw == ffi.NULL:
                return None
            return str(ffi.string(raw).decode("utf-8", "replace"))

    def is_eog(self, token: int) -> bool:
        """Whether ``token`` ends generation (EOS, EOT, ...)."""
        self.check_tokens([token])
        with self._handle.lease():
            return bool(lib.llama_vocab_is_eog(self._vocab, token))

    def is_control(self, token: int) -> bool:
        self.check_tokens([token])
        with self._handle.lease():
            return bool(lib.llama_vocab_is_control(self._vocab, token))

    @property
    def eog_tokens(self) -> frozenset[int]:
        """Every end-of-generation token of the vocabulary."""
        if self._eog is None:
            with self._handle.lease():
                self._eog = frozenset(
                    t for t in range(self.n_vocab) if lib.llama_vocab_is_eog(self._vocab, t)
                )
        self._check_open()
        return self._eog

    # -- tokens (SPEC L4) ------------------------------------------------------

    def check_tokens(self, tokens: Sequence[int]) -> None:
        """Raise :class:`InvalidToken` unless every id is in ``[0, n_vocab)``."""
        _vocab.check_tokens(tokens, self.n_vocab)

    def tokenize(
        self, text: str, *, add_special: bool = True, parse_special: bool = False
    ) -> list[int]:
        """Text to token ids. ``add_special`` adds BOS/EOS as the model asks;
        ``parse_special`` turns spelled-out special tokens into their ids."""
        if not isinstance(text, str):
            raise BadRequest(f"tokenize expects str, not {type(text).__name__}")
        with self._handle.lease():
            return _vocab.tokenize(self._vocab, text, add_special, parse_special)

    def detokenize(
        self,
        tokens: Sequence[int],
        *,
        remove_special: bool = False,
        unparse_special: bool = False,
    ) -> str:
        """Token ids back to text (undecodable bytes become U+FFFD)."""
        return self.detokenize_bytes(
            tokens, remove_special=remove_special, unparse_special=unparse_special
        ).decode("utf-8", "replace")

    def detokenize_bytes(
        self,
        tokens: Sequence[int],
        *,
        remove_special: bool = False,
        unparse_special: bool = False,
    ) -> bytes:
        """Token ids back to raw bytes."""
        with self._handle.lease():
            return _vocab.detokenize(
                self._vocab, tokens, self.n_vocab, remove_special, unparse_special
            )

    def token_piece(self, token: int, *, special: bool = False) -> bytes:
        """The bytes one token renders as (may be part of a UTF-8 sequence)."""
        self.check_tokens([token])
        with self._handle.lease():
            return _vocab.token_piece(self._vocab, token, special)

    @property
    def max_token_bytes(self) -> int | None:
        """The most bytes of text one token stands for, when this vocabulary's
        tokenizer puts every byte of a text in exactly one token (then a text
        of ``B`` bytes makes at least ``ceil(B / max_token_bytes)`` tokens);
        ``None`` when it may drop or merge text (WPM, UGM, special tokens that
        strip whitespace). Measured once, over the whole vocabulary."""
        if self._max_token_bytes == -1:
            longest = None
            if _vocab.pieces_cover_text(self.metadata):
                with self._handle.lease():
                    longest = _vocab.longest_piece(self._vocab, self.n_vocab) or None
            self._max_token_bytes = longest
        return self._max_token_bytes

    # -- dependants --------------------------------------------------------------

    def context(self, options: ContextOptions | None = None) -> Context:
        """A new :class:`Context` on this model."""
        return Context(self, options)

    def load_adapter(self, path: str | os.PathLike[str]) -> LoraAdapter:
        """Load a LoRA adapter GGUF for this model (attach it with
        :meth:`Context.set_adapter`)."""
        adapter = LoraAdapter(self, path)
        self._adapters.add(adapter)
        return adapter

    @property
    def adapters(self) -> tuple[LoraAdapter, ...]:
        """Adapters loaded on this model and not yet unloaded."""
        return tuple(a for a in list(self._adapters) if not a.closed)

    def _register_context(self, ctx: Context) -> None:
        self._contexts.add(ctx)

    def _live_contexts(self) -> list[Context]:
        return list(self._contexts)


def _model_free(path: str) -> Callable[[Any], None]:
    def free(ptr: Any) -> None:
        lib.llama_model_free(ptr)
        log.info("model.freed", path=path)

    return free


def _token_or_none(token: int) -> int | None:
    return None if token == lib.LLAMA_TOKEN_NULL else int(token)
