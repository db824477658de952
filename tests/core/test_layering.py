"""The layering of the code base, checked on its own imports (static: module- and function-level).

Layers, lowest first; a module may import its own layer and any lower one, never a higher one,
and no two modules may import each other, directly or through others (no cycle):

    core -> engine -> models, tasks -> training, learning, tuning, jobs -> controllers, scorers
         -> testing, integrations, profiling -> experiments -> cli

``controllers/`` and ``scorers/`` are plugins: they build on the framework's lower layers and the
registries load them by name, so nothing below them imports them statically.
"""

from __future__ import annotations

import ast
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
PACKAGES = ("framework", "controllers", "scorers", "experiments")  # folders, imported as adaptive_decoding.<folder>
NAMESPACE = "adaptive_decoding"
LAYERS = {
    "framework.core": 0,
    "framework.engine": 1,
    "framework.models": 2, "framework.tasks": 2,
    "framework.training": 3, "framework.learning": 3, "framework.tuning": 3, "framework.jobs": 3,
    "controllers": 4, "scorers": 4,
    "framework.testing": 5, "framework.integrations": 5, "framework.profiling": 5,
    "experiments": 6,
    "framework.cli": 7,
    "framework": 8,  # the package's __init__: the public API re-exports from every layer
}


def _modules() -> dict[str, pathlib.Path]:
    out = {}
    for pkg in PACKAGES:
        for path in (ROOT / pkg).rglob("*.py"):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            out[".".join(parts)] = path
    return out


def _imports(name: str, path: pathlib.Path, known: set[str]) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    pkg = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = pkg.split(".")[: len(pkg.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            targets = [f"{base}.{a.name}" for a in node.names] + [base]
        else:
            continue
        for target in targets:
            target = target.removeprefix(NAMESPACE + ".")
            while target and target not in known:
                target = target.rpartition(".")[0]
            if target and target != name:
                found.add(target)
    if path.name == "__init__.py":  # a package re-exporting its own submodules is not a dependency
        found = {t for t in found if not t.startswith(name + ".")}
    return found


def _graph() -> dict[str, set[str]]:
    mods = _modules()
    return {name: _imports(name, path, set(mods)) for name, path in mods.items()}


def layer_of(module: str) -> int:
    best = max((p for p in LAYERS if module == p or module.startswith(p + ".")), key=len)
    return LAYERS[best]


def find_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []
    counter = 0
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            v, children = work[-1]
            for w in children:
                if w not in index:
                    index[w] = low[w] = counter
                    counter += 1
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(graph.get(w, ())))))
                    break
                if w in on_stack:
                    low[v] = min(low[v], index[w])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[v])
                if low[v] == index[v]:
                    comp = []
                    while True:
                        w = stack.pop()
                        on_stack.discard(w)
                        comp.append(w)
                        if w == v:
                            break
                    if len(comp) > 1:
                        cycles.append(sorted(comp))
    return cycles


def test_no_import_cycle():
    assert find_cycles(_graph()) == []


def test_no_upward_import():
    upward = [f"{a} (layer {layer_of(a)}) imports {b} (layer {layer_of(b)})"
              for a, deps in _graph().items() for b in sorted(deps) if layer_of(b) > layer_of(a)]
    assert upward == []


def test_every_import_of_the_four_folders_goes_through_the_namespace():
    """``import framework`` works from a checkout's root only by accident (the working directory on
    ``sys.path``); installed from the wheel it finds a user's own ``framework`` or nothing."""
    bare = []
    for path in sorted(p for pkg in (*PACKAGES, "tests") for p in (ROOT / pkg).rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                     [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else [])
            bare += [f"{path.relative_to(ROOT)}:{node.lineno}: {n}" for n in names if n.split(".")[0] in PACKAGES]
    assert bare == []


def test_cycle_finder_finds_a_cycle():
    """The checker itself: a designed graph with one cycle and one tail."""
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert find_cycles(graph) == [["a", "b", "c"]]
    assert find_cycles({"a": {"b"}, "b": set()}) == []


@pytest.mark.parametrize("module,layer", [("framework.core.rng", 0), ("framework.engine.loop", 1),
                                          ("experiments.runner", 6), ("framework.cli.decode", 7)])
def test_layer_of(module, layer):
    assert layer_of(module) == layer
