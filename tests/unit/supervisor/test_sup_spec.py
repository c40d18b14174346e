"""ChildSpec / SupFlags / SupervisorSpec validation: invalid values raise naming the field."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from llamad.errors import ConfigError, LlamadError, error_class, from_wire
from llamad.supervisor.errors import InvalidSpec
from llamad.supervisor.spec import (
    BRUTAL_KILL,
    INFINITY,
    AutoShutdown,
    ChildSpec,
    ChildType,
    Restart,
    Start,
    Strategy,
    SupervisorSpec,
    SupFlags,
    supervisor_child,
)

pytestmark = pytest.mark.timeout(60)

START = Start("pkg.mod:fn", ("a", 1), {"k": b"v"})


def spec(**kw: Any) -> ChildSpec:
    return ChildSpec(**{"id": "w", "start": START, **kw})


def field_of(exc_info: pytest.ExceptionInfo[InvalidSpec]) -> str:
    return exc_info.value.field


# --------------------------------------------------------------------- Start


@pytest.mark.parametrize("target", ["", "mod", "mod:", ":fn", "a b:c", "mod:fn()", "1mod:fn"])
def test_start_target_must_name_module_and_function(target: str) -> None:
    with pytest.raises(InvalidSpec) as e:
        Start(target)
    assert field_of(e) == "start.target"


def test_start_args_must_be_msgpackable() -> None:
    with pytest.raises(InvalidSpec) as e:
        Start("m:f", (object(),))
    assert field_of(e) == "start.args"


def test_start_kwargs_need_string_keys() -> None:
    with pytest.raises(InvalidSpec) as e:
        Start("m:f", (), {1: "x"})  # type: ignore[dict-item]
    assert field_of(e) == "start.kwargs"


def test_start_of_rejects_functions_a_fresh_interpreter_cannot_import() -> None:
    def local() -> None:
        pass

    with pytest.raises(InvalidSpec) as e:
        Start.of(local)
    assert field_of(e) == "start.target"


def test_start_of_names_module_level_function() -> None:
    assert Start.of(math.sqrt, 4).target == "math:sqrt"


def test_extra_args_are_appended_for_dynamic_children() -> None:
    assert START.with_extra_args(["x"]).args == ("a", 1, "x")


# ----------------------------------------------------------------- ChildSpec


def test_shutdown_defaults_follow_child_type() -> None:
    assert spec().shutdown == 5.0
    assert spec(type="supervisor").shutdown == INFINITY


@pytest.mark.parametrize("value", [-1, math.nan, math.inf, "soon", True, None.__class__])
def test_invalid_shutdown_is_rejected(value: Any) -> None:
    with pytest.raises(InvalidSpec) as e:
        spec(shutdown=value)
    assert field_of(e) == "shutdown"


@pytest.mark.parametrize("value", [BRUTAL_KILL, INFINITY, 0, 2.5])
def test_valid_shutdown_is_kept(value: Any) -> None:
    assert spec(shutdown=value).shutdown == value


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("id", ""),
        ("id", "has space"),
        ("id", 7),
        ("id", "x" * 201),
        ("restart", "sometimes"),
        ("type", "manager"),
        ("significant", "yes"),
        ("liveness_timeout", 0),
        ("liveness_timeout", -1.0),
        ("start_timeout", math.nan),
        ("start", "m:f"),
    ],
)
def test_invalid_child_field_is_named(field: str, value: Any) -> None:
    with pytest.raises(InvalidSpec) as e:
        spec(**{field: value})
    assert field_of(e) == field


def test_significant_permanent_child_is_rejected() -> None:
    with pytest.raises(InvalidSpec) as e:
        spec(restart="permanent", significant=True)
    assert field_of(e) == "significant"


@pytest.mark.parametrize("restart", ["transient", "temporary"])
def test_significant_transient_or_temporary_child_is_accepted(restart: str) -> None:
    assert spec(restart=restart, significant=True).significant


def test_strings_become_enums() -> None:
    s = spec(restart="transient", type="supervisor")
    assert s.restart is Restart.TRANSIENT and s.type is ChildType.SUPERVISOR


def test_invalid_spec_is_a_config_error_with_a_stable_code() -> None:
    with pytest.raises(ConfigError) as e:
        spec(restart="bogus")
    assert isinstance(e.value, LlamadError)
    assert e.value.code == "invalid_spec"
    assert error_class("invalid_spec") is InvalidSpec


@pytest.mark.parametrize(
    ("env", "field"),
    [
        ("A=1", "env"),
        ({"": "x"}, "env"),
        ({"1ABC": "x"}, "env"),
        ({"A=B": "x"}, "env"),
        ({"A B": "x"}, "env"),
        ({"A\0": "x"}, "env"),
        ({7: "x"}, "env"),
        ({"LLAMAD_X": 1}, "env.LLAMAD_X"),
        ({"LLAMAD_X": b"bytes"}, "env.LLAMAD_X"),
        ({"LLAMAD_X": "nul\0inside"}, "env.LLAMAD_X"),
        ({"LLAMAD_X": "x" * 40_000}, "env.LLAMAD_X"),
    ],
)
def test_invalid_env_is_refused_naming_the_field(env: Any, field: str) -> None:
    with pytest.raises(InvalidSpec) as e:
        spec(env=env)
    assert field_of(e) == field


@pytest.mark.parametrize("cwd", ["relative/dir", "", "/tmp/nul\0", b"/tmp", 3])
def test_cwd_must_be_an_absolute_path(cwd: Any) -> None:
    with pytest.raises(InvalidSpec) as e:
        spec(cwd=cwd)
    assert field_of(e) == "cwd"


def test_env_and_cwd_are_kept_frozen() -> None:
    source = {"LLAMAD_MODEL": "smollm2", "_x1": ""}
    s = spec(env=source, cwd=Path("/srv/models"))
    source["LLAMAD_MODEL"] = "changed"
    assert dict(s.env) == {"LLAMAD_MODEL": "smollm2", "_x1": ""}
    assert s.cwd == "/srv/models"
    with pytest.raises(TypeError):
        s.env["NEW"] = "x"  # type: ignore[index]


def test_env_and_cwd_survive_with_start() -> None:
    s = spec(env={"A": "1"}, cwd="/srv").with_start(START.with_extra_args(["x"]), "w2")
    assert (dict(s.env), s.cwd) == ({"A": "1"}, "/srv")


def test_env_error_from_the_wire_names_its_place() -> None:
    wire = SupervisorSpec("s", SupFlags(), (spec(),)).to_wire()
    wire["children"][0]["env"] = {"OK": 5}
    with pytest.raises(InvalidSpec) as e:
        SupervisorSpec.from_wire(wire)
    assert field_of(e) == "children[0].env.OK"


# ------------------------------------------------------------------ SupFlags


def test_sup_flags_defaults_are_otps() -> None:
    flags = SupFlags()
    assert (flags.strategy, flags.intensity, flags.period, flags.auto_shutdown) == (
        Strategy.ONE_FOR_ONE,
        1,
        5.0,
        AutoShutdown.NEVER,
    )


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("strategy", "one_for_some"),
        ("intensity", -1),
        ("intensity", 1.5),
        ("intensity", True),
        ("period", 0),
        ("period", -5),
        ("period", math.inf),
        ("auto_shutdown", "sometimes"),
    ],
)
def test_invalid_sup_flag_is_named(field: str, value: Any) -> None:
    with pytest.raises(InvalidSpec) as e:
        SupFlags(**{field: value})
    assert field_of(e) == field


# ------------------------------------------------------------ SupervisorSpec


def test_significant_child_under_auto_shutdown_never_is_rejected() -> None:
    child = spec(restart="transient", significant=True)
    with pytest.raises(InvalidSpec) as e:
        SupervisorSpec("s", SupFlags(), (spec(id="a"), child))
    assert field_of(e) == "children[1].significant"
    SupervisorSpec("s", SupFlags(auto_shutdown="any_significant"), (child,))


def test_duplicate_child_ids_are_rejected() -> None:
    with pytest.raises(InvalidSpec) as e:
        SupervisorSpec("s", SupFlags(), (spec(id="a"), spec(id="a")))
    assert field_of(e) == "children[1].id"


@pytest.mark.parametrize("n", [0, 2])
def test_simple_one_for_one_needs_exactly_one_template(n: int) -> None:
    children = tuple(spec(id=f"c{i}") for i in range(n))
    with pytest.raises(InvalidSpec) as e:
        SupervisorSpec("s", SupFlags(strategy="simple_one_for_one"), children)
    assert field_of(e) == "children"


def test_supervisor_child_runs_the_supervisor_entry() -> None:
    inner = SupervisorSpec("inner", SupFlags(), (spec(),))
    child = supervisor_child(inner)
    assert child.id == "inner"
    assert child.type is ChildType.SUPERVISOR
    assert child.shutdown == INFINITY
    assert SupervisorSpec.from_wire(child.start.kwargs["spec"]) == inner


# -------------------------------------------------------------------- wire

names = st.from_regex(r"[a-z][a-z0-9_.-]{0,20}", fullmatch=True)
plain = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**63 - 1) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3),
    max_leaves=6,
)
starts = st.builds(
    Start,
    target=st.sampled_from(["a.b:c", "pkg:fn", "x.y.z:Cls.method"]),
    args=st.lists(plain, max_size=3).map(tuple),
    kwargs=st.dictionaries(names, plain, max_size=3),
)


@st.composite
def child_specs(draw: st.DrawFn) -> ChildSpec:
    restart = draw(st.sampled_from(list(Restart)))
    return ChildSpec(
        id=draw(names),
        start=draw(starts),
        restart=restart,
        shutdown=draw(st.none() | st.sampled_from([BRUTAL_KILL, INFINITY]) | st.floats(0, 100)),
        type=draw(st.sampled_from(list(ChildType))),
        significant=restart is not Restart.PERMANENT and draw(st.booleans()),
        liveness_timeout=draw(st.none() | st.floats(0.01, 100)),
        start_timeout=draw(st.none() | st.floats(0.01, 100)),
        env=draw(
            st.dictionaries(
                st.from_regex(r"[A-Za-z_][A-Za-z0-9_]{0,10}", fullmatch=True),
                # ChildSpec refuses NUL and lone surrogates (neither can reach execve).
                st.text(
                    st.characters(exclude_characters="\0", exclude_categories=("Cs",)),
                    max_size=8,
                ),
                max_size=3,
            )
        ),
        cwd=draw(st.none() | st.sampled_from(["/", "/srv/llamad", "/tmp/x y"])),
    )


@settings(deadline=None)
@given(child_specs())
def test_child_spec_wire_round_trip(child: ChildSpec) -> None:
    assert ChildSpec.from_wire(child.to_wire()) == child


@settings(max_examples=40, deadline=None)
@given(st.lists(child_specs(), max_size=4, unique_by=lambda c: c.id))
def test_supervisor_spec_wire_round_trip(children: list[ChildSpec]) -> None:
    flags = SupFlags(auto_shutdown="any_significant", intensity=3, period=2.5)
    sup = SupervisorSpec("s", flags, tuple(children))
    assert SupervisorSpec.from_wire(sup.to_wire()) == sup


def test_from_wire_rejects_unknown_fields_by_name() -> None:
    wire = spec().to_wire() | {"colour": "red"}
    with pytest.raises(InvalidSpec) as e:
        ChildSpec.from_wire(wire)
    assert field_of(e) == "colour"


def test_from_wire_names_nested_field() -> None:
    sup = SupervisorSpec("s", SupFlags(), (spec(),)).to_wire()
    sup["children"][0]["restart"] = "never"
    with pytest.raises(InvalidSpec) as e:
        SupervisorSpec.from_wire(sup)
    assert field_of(e) == "children[0].restart"


def test_from_wire_rejects_non_mapping() -> None:
    with pytest.raises(InvalidSpec):
        ChildSpec.from_wire(["id", "start"])


def test_invalid_spec_survives_the_wire_with_its_field() -> None:
    with pytest.raises(InvalidSpec) as e:
        spec(restart="bogus")
    rebuilt = from_wire(e.value.to_wire())
    assert isinstance(rebuilt, InvalidSpec)
    assert (rebuilt.field, rebuilt.problem, str(rebuilt)) == (
        "restart",
        e.value.problem,
        str(e.value),
    )
