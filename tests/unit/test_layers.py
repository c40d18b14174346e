"""The house's floors: which package may import which (ARCHITECTURE, layout).

Read from the source, not from a running process, so an import inside a
function counts as much as one at the top (only ``TYPE_CHECKING`` blocks,
which never run, are left out). A package imports only from the floors below
its own; two packages on one floor do not import each other. The top-level
modules (``errors``, ``paths``, ``logs``, ``_pins``, ``_lazy``, ``_heap``) are the ground
floor; the public face (``llamad/__init__``, whose names come from every
floor) is the top. A module-level import loop may not join files of two packages either.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path

import llamad

SRC = Path(llamad.__file__).resolve().parent

#: Bottom to top. Each line may import from the lines above it only.
FLOORS: tuple[frozenset[str], ...] = (
    frozenset({"llamad"}),  # errors, paths, logs, _pins, _lazy, _heap, the face
    frozenset({"llama_ffi", "actors", "kv_events"}),
    frozenset({"supervisor"}),
    frozenset({"cache"}),
    frozenset({"model"}),
    frozenset({"config"}),
    frozenset({"front"}),
    # testing (the daemon harness of tests, benches and `make run`, a scratch
    # cache with cache-meta as a process, the toy actor) starts the daemon,
    # cache-meta and the toy as programs, over actors, cache, config and
    # front.wire: it imports neither client nor daemon, so it shares their
    # floor, below cli, whose demo uses it; no package of the daemon imports it.
    frozenset({"client", "daemon", "testing"}),
    # The HTTP gateway is a client of the daemon (over llamad.AsyncClient) that
    # the daemon's tree starts by its entry's name, never by importing it.
    frozenset({"cli", "gateway"}),
    # The public face re-exports every floor's names: nothing below imports it.
    frozenset({"face"}),
)
FLOOR = {pkg: i for i, floor in enumerate(FLOORS) for pkg in floor}


def _module_name(path: Path) -> str:
    parts = ("llamad", *path.relative_to(SRC).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _package(module: str) -> str:
    if module == "llamad":
        return "face"
    parts = module.split(".")
    return parts[1] if (SRC / parts[1]).is_dir() else "llamad"


def _is_module(name: str) -> bool:
    return (SRC / name).is_dir() or (SRC / f"{name}.py").is_file()


def _imports(path: Path, *, top_level_only: bool) -> Iterator[str]:
    tree = ast.parse(path.read_text(), str(path))
    skipped: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skipped.update(id(n) for n in ast.walk(node))
    nodes = tree.body if top_level_only else ast.walk(tree)
    for node in nodes:
        if id(node) in skipped:
            continue
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module == "llamad":
                for a in node.names:
                    yield f"llamad.{a.name}" if _is_module(a.name) else "llamad"
            elif node.module.startswith("llamad."):
                yield node.module
        elif isinstance(node, ast.Import):
            yield from (a.name for a in node.names if a.name.startswith("llamad"))


def _sources() -> list[Path]:
    return sorted(p for p in SRC.rglob("*.py") if "__pycache__" not in p.parts)


def test_every_package_has_a_floor() -> None:
    packages = {_package(_module_name(p)) for p in _sources()}
    assert packages == set(FLOOR)
    assert _package("llamad") == "face" and _package("llamad.errors") == "llamad"


def test_no_import_runs_back_up_or_across_a_floor() -> None:
    wrong = []
    for path in _sources():
        module = _module_name(path)
        here = _package(module)
        for target in _imports(path, top_level_only=False):
            there = _package(target)
            if there != here and FLOOR[there] >= FLOOR[here]:
                wrong.append(f"{module} ({here}) imports {target} ({there})")
    assert not wrong


def _known(module: str, names: set[str]) -> str | None:
    """``module``, or the package whose face it names through (``llamad.x.Y``)."""
    while module and module not in names:
        module = module.rpartition(".")[0]
    return module or None


def test_no_module_level_import_loop_joins_two_packages() -> None:
    paths = {_module_name(p): p for p in _sources()}
    graph: dict[str, set[str]] = defaultdict(set)
    for module, path in paths.items():
        for target in _imports(path, top_level_only=True):
            known = _known(target, set(paths))
            if known is not None and known != module:
                graph[module].add(known)
    # Tarjan's strongly connected components.
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    loops: list[set[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = set()
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.add(w)
                if w == v:
                    break
            if len(component) > 1:
                loops.append(component)

    for v in sorted(paths):
        if v not in index:
            visit(v)
    across = [sorted(c) for c in loops if len({_package(m) for m in c}) > 1]
    assert not across
