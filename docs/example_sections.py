"""A griffe extension for the API reference: the package's docstrings title their doctests
``Example:``, which Google style reads as an admonition of Markdown; read them as the
``Examples:`` section, so the doctests render as code."""

import re

import griffe

EXAMPLE = re.compile(r"^(\s*)Example:\s*$", flags=re.M)


class ExampleSections(griffe.Extension):
    def on_instance(self, *, obj: griffe.Object, **kwargs) -> None:
        if obj.docstring is not None:
            obj.docstring.value = EXAMPLE.sub(r"\1Examples:", obj.docstring.value)
