"""The ``llamad`` command's exit status per error family, and its one error line."""

from __future__ import annotations

import importlib

import pytest

from llamad import errors
from llamad.cli.errors import (
    EXIT_CONFIG,
    EXIT_ERROR,
    EXIT_MODEL_FAILED,
    EXIT_NOT_FOUND,
    EXIT_REFUSED,
    EXIT_TRY_AGAIN,
    EXIT_UNAVAILABLE,
    error_line,
    exit_code,
)

pytestmark = pytest.mark.timeout(30)


def _every_class() -> dict[str, type[errors.LlamadError]]:
    for name in errors.ERROR_MODULES:
        importlib.import_module(name)
    return {code: errors.error_class(code) for code in list(errors._BY_CODE)}


@pytest.mark.parametrize(
    ("code", "status"),
    [
        ("bad_request", EXIT_REFUSED),
        ("invalid_token", EXIT_REFUSED),
        ("invalid_grammar", EXIT_REFUSED),
        ("bad_schema", EXIT_REFUSED),
        ("context_overflow", EXIT_REFUSED),
        ("transcript_mismatch", EXIT_REFUSED),
        ("template_security", EXIT_REFUSED),
        ("model_not_found", EXIT_NOT_FOUND),
        ("no_session", EXIT_NOT_FOUND),
        ("unavailable", EXIT_UNAVAILABLE),
        ("worker_crashed", EXIT_MODEL_FAILED),
        ("model_failed", EXIT_MODEL_FAILED),
        ("model_load_failed", EXIT_MODEL_FAILED),
        ("decode_failed", EXIT_MODEL_FAILED),
        ("overloaded", EXIT_TRY_AGAIN),
        ("sticky_busy", EXIT_TRY_AGAIN),
        ("timeout", EXIT_TRY_AGAIN),
        ("config_error", EXIT_CONFIG),
        ("path_not_allowed", EXIT_CONFIG),
        ("not_gguf", EXIT_CONFIG),
        ("truncated_gguf", EXIT_CONFIG),
        ("internal", EXIT_ERROR),
        ("kvc_corrupt", EXIT_ERROR),
    ],
)
def test_each_family_has_its_exit_status(code: str, status: int) -> None:
    classes = _every_class()
    err = classes[code].rebuild("m", None)
    assert exit_code(err) == status


def test_every_coded_error_has_a_documented_status() -> None:
    documented = {1, 65, 66, 69, 70, 75, 78}
    for code, cls in _every_class().items():
        assert exit_code(cls.rebuild("m", None)) in documented, code


def test_the_error_line_is_one_line_with_the_code() -> None:
    err = errors.ConfigError("invalid configuration:\n  models.m.n_ctx: expected an integer")
    assert error_line(err) == (
        "llamad: config_error: invalid configuration: models.m.n_ctx: expected an integer"
    )


def test_an_absent_daemon_gets_the_hint_and_a_worker_does_not() -> None:
    endpoint = "ipc:///tmp/x/llamad.sock"
    front = errors.Unavailable(f"nothing listens on {endpoint}", details={"endpoint": endpoint})
    assert "start it with `llamad daemon`" in error_line(front, endpoint=endpoint)
    worker = errors.Unavailable("model 'smol' has no live worker")
    assert "llamad daemon" not in error_line(worker, endpoint=endpoint)


def test_permission_denied_is_in_the_unavailable_family() -> None:
    from llamad.errors import PermissionDenied  # noqa: PLC0415

    assert exit_code(PermissionDenied("another user's socket")) == 69
