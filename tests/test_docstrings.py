"""Every docstring example in the package runs and shows what it says (those marked
``+SKIP`` need a model or a file the reader has)."""

from __future__ import annotations

import doctest
import importlib
import pkgutil
from pathlib import Path

import pytest

import forgetwatch

ROOT = Path(__file__).resolve().parents[1]
MODULES = sorted(
    m.name for m in pkgutil.walk_packages(forgetwatch.__path__, "forgetwatch.") if m.name != "forgetwatch.__main__"
)


#: plugins that a training framework imports: they need it installed (tests/test_frameworks.py runs them)
FRAMEWORKS = {
    "forgetwatch.integrations.axolotl": "axolotl",
    "forgetwatch.integrations.swift.forgetwatch_plugin": "swift",
}


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name, monkeypatch):
    monkeypatch.chdir(ROOT)  # examples name the shipped configs/ by relative path
    if name in FRAMEWORKS:
        pytest.importorskip(FRAMEWORKS[name])
    result = doctest.testmod(importlib.import_module(name), optionflags=doctest.ELLIPSIS, report=True)
    assert result.failed == 0
