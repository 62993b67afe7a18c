"""The package's layers, and the one way its imports point: a lower layer never imports a higher
one (results never import the run, nothing below them imports a trainer integration)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "forgetwatch"

#: lowest first: each may import those before it, never those after it
LAYERS = [
    "common",
    "behaviour",
    "probes",
    "starters",
    "config",
    "results",
    "store",
    "scoring",
    "sinks",
    "run",
    "replay",
    "merge",
    "attribution",
    "integrations",
    "page",
    "cli",
]


def imports() -> list[tuple[str, str, str]]:
    """``(file, its layer, the layer it imports)`` for every import of a forgetwatch module."""
    found = []
    for path in PACKAGE.rglob("*.py"):
        rel = path.relative_to(PACKAGE)
        layer = rel.parts[0] if len(rel.parts) > 1 else None
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.level:
                raise AssertionError(f"{rel}: a relative import; write forgetwatch.<layer>.<module>")
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("forgetwatch."):
                found.append((str(rel), layer, node.module.split(".")[1]))
    return found


def module_imports() -> dict[str, set[str]]:
    """Each forgetwatch module and the forgetwatch modules it imports anywhere: at the top, in
    functions, under ``TYPE_CHECKING`` (``from forgetwatch.x import y`` names module ``y`` when
    there is one, else ``forgetwatch.x``)."""

    def name(path: Path) -> str:
        parts = ("forgetwatch", *path.relative_to(PACKAGE).with_suffix("").parts)
        return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)

    modules = {name(path): path for path in PACKAGE.rglob("*.py")}
    edges: dict[str, set[str]] = {m: set() for m in modules}
    for module, path in modules.items():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("forgetwatch"):
                targets = [
                    f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in modules else node.module
                    for a in node.names
                ]
            elif isinstance(node, ast.Import):
                targets = [a.name for a in node.names if a.name.startswith("forgetwatch")]
            else:
                continue
            for target in targets:
                while target not in modules and "." in target:
                    target = target.rsplit(".", 1)[0]
                if target != module:
                    edges[module].add(target)
    return edges


def circles(edges: dict[str, set[str]]) -> list[set[str]]:
    """The groups of modules that import each other, directly or around a circle (Tarjan)."""
    order: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found = []

    def visit(v: str) -> None:
        order[v] = low[v] = len(order)
        stack.append(v)
        for w in edges[v]:
            if w not in order:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], order[w])
        if low[v] == order[v]:
            group = set()
            while not group or w != v:
                w = stack.pop()
                group.add(w)
            if len(group) > 1:
                found.append(group)

    for v in edges:
        if v not in order:
            visit(v)
    return found


def test_circles_are_found():
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [{"a", "b", "c"}]
    assert circles({"a": {"b"}, "b": set()}) == []


def test_no_modules_import_each_other():
    assert circles(module_imports()) == []


@pytest.mark.parametrize("plug_in", ["replay", "merge", "attribution"])
def test_plug_ins_beside_the_monitor_are_never_imported_by_it(plug_in):
    allowed = (f"forgetwatch.{plug_in}", "forgetwatch.integrations", "forgetwatch.cli")
    importers = {
        module
        for module, imported in module_imports().items()
        if any(m.startswith(f"forgetwatch.{plug_in}") for m in imported)
        and not module.startswith(allowed)
        and module != "forgetwatch"  # the package's own exports
    }
    assert importers == set()


def test_nothing_reads_another_object_s_stack_frames():
    readers = {
        str(path.relative_to(PACKAGE))
        for path in PACKAGE.rglob("*.py")
        if any(word in path.read_text(encoding="utf-8") for word in ("_getframe", "currentframe", "f_locals"))
    }
    assert readers == set(), readers


def test_forgetwatch_warns_of_no_deprecation():
    # unreleased: an old name is simply gone (a TypeError that names the new form), never a shim
    warned = {
        str(path.relative_to(PACKAGE))
        for path in PACKAGE.rglob("*.py")
        for call in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
        if isinstance(call, ast.Call)
        and getattr(call.func, "attr", getattr(call.func, "id", None)) == "warn"
        and any(getattr(a, "id", None) in ("FutureWarning", "DeprecationWarning") for a in ast.walk(call))
    }
    assert warned == set(), warned


def test_every_package_is_a_layer():
    packages = {p.parent.name for p in PACKAGE.glob("*/__init__.py")}
    assert packages == set(LAYERS)


def test_imports_point_down_the_layers_only():
    upward = [
        (f, layer, target)
        for f, layer, target in imports()
        if layer in LAYERS and target in LAYERS and LAYERS.index(target) > LAYERS.index(layer)
    ]
    assert upward == []


def test_nothing_imports_the_trainer_integrations_but_the_package_and_the_command():
    users = {f for f, layer, target in imports() if target == "integrations" and layer != "integrations"}
    assert users <= {"__init__.py", "cli/__init__.py", "cli/demo.py"}, users
