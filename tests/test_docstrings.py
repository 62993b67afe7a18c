"""Every docstring example in the package runs and shows what it says (those marked
``+SKIP`` need a model or a file the reader has)."""

from __future__ import annotations

import doctest
import importlib
import logging
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


def test_every_docstring_reads_as_the_docs_site_reads_it():
    """griffe (what mkdocstrings parses docstrings with) warns of nothing: one ``Args:`` entry per parameter, each
    named as in the signature (mkdocs build --strict stops on such a warning)."""
    griffe = pytest.importorskip("griffe")
    warned = []

    class Collect(logging.Handler):
        def emit(self, record):
            warned.append(record.getMessage())

    handler = Collect(logging.WARNING)
    logging.getLogger("griffe").addHandler(handler)
    try:
        package = griffe.load("forgetwatch", search_paths=[str(ROOT)], docstring_parser="google")
        todo = [package]
        while todo:
            obj = todo.pop()
            if obj.is_alias:
                continue
            if obj.docstring is not None:
                obj.docstring.parsed  # noqa: B018 - parsing is what warns
            todo.extend(obj.members.values())
    finally:
        logging.getLogger("griffe").removeHandler(handler)
    assert warned == []
