"""The package's layers, and the one way its imports point: a lower layer never imports a higher
one (results never import the run, nothing below them imports a trainer integration)."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "forgetwatch"

#: lowest first: each may import those before it, never those after it
LAYERS = [
    "common",
    "behaviour",
    "probes",
    "starters",
    "config",
    "results",
    "scoring",
    "sinks",
    "run",
    "replay",
    "integrations",
    "reporting",
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
