"""Every code block of README.md and of the docs' pages works on a fresh clone.

The README's ```python blocks run in order, in one namespace, offline; each docs page's run
in order after them, in a copy of that namespace (the quick start's names: ``world``,
``probes``, ``trainer``, ...). A block right after an ``<!-- not run: ... -->`` comment is
skipped: it needs a download. Every ```bash line names commands, flags, files and extras that
exist. The ```json blocks are valid probe files.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shlex
import tomllib
from pathlib import Path

import pytest
import yaml

import forgetwatch
from forgetwatch import ProbeKind, ProbeSet
from forgetwatch.cli import main
from forgetwatch.integrations.framework_settings import FrameworkSettings
from forgetwatch.integrations.swift import PLUGIN_FILE

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCS = sorted((ROOT / "docs").glob("*.md"))
NOT_RUN = "<!-- not run:"
README_LINES = 250  # the README says what forgetwatch is and how to start; the docs site the rest


def page(name: str) -> str:
    return (ROOT / "docs" / name).read_text(encoding="utf-8")


def blocks(language: str, text: str | None = None) -> list[tuple[str, bool]]:
    """``(code, skipped)`` for each fenced block in ``language``; skipped when the line before
    its fence is a ``<!-- not run: ... -->`` comment."""
    text = README.read_text(encoding="utf-8") if text is None else text
    found = []
    for match in re.finditer(rf"^```{language}\n(.*?)^```$", text, flags=re.S | re.M):
        before = text[: match.start()].rstrip("\n").rsplit("\n", 1)[-1]
        found.append((match.group(1), before.startswith(NOT_RUN)))
    return found


def test_block_extraction_sees_the_skip_marker():
    text = "a\n```python\nx = 1\n```\n<!-- not run: needs a download -->\n```python\ny = 2\n```\n"
    assert blocks("python", text) == [("x = 1\n", False), ("y = 2\n", True)]


def test_only_dataset_downloads_are_skipped():
    python = [block for path in [README, *DOCS] for block in blocks("python", path.read_text(encoding="utf-8"))]
    skipped = [code for code, skip in python if skip]
    assert len(python) >= 10 and skipped  # MMLU-style presets; IFEval and HarmBench
    assert all("load_dataset(" in code for code in skipped)
    assert not any("load_dataset(" in code for code, skip in python if not skip)
    assert not any(skip for _, skip in blocks("python"))  # the README's all run


def test_the_quick_start_shows_the_readme_example():
    readme = [code for code, _ in blocks("python")]
    assert blocks("python", page("quickstart.md"))[0][0] == readme[0]


def run_blocks(text: str, name: str, namespace: dict, done: set[str] = frozenset()) -> None:
    """Run ``text``'s python blocks in order in ``namespace``; a block already run (``done``) is
    not run again."""
    for i, (code, skipped) in enumerate(blocks("python", text)):
        if not skipped and code not in done:
            exec(compile(code, f"{name} python block {i + 1}", "exec"), namespace)


@pytest.fixture(scope="module")
def readme_run(tmp_path_factory):
    """The README's blocks, run once in a folder of their own: (its namespace, the folder)."""
    pytest.importorskip("trl")
    folder = tmp_path_factory.mktemp("readme")
    (folder / "configs").symlink_to(ROOT / "configs", target_is_directory=True)
    namespace: dict = {"__name__": "__readme__"}
    with contextlib.chdir(folder):
        run_blocks(README.read_text(encoding="utf-8"), "README.md", namespace)
    return namespace, folder


@pytest.mark.slow
def test_readme_python_blocks_run_in_order(readme_run):
    namespace, folder = readme_run
    assert (folder / "out" / "forgetwatch" / "history.jsonl").is_file()
    assert namespace["trainer"].state.global_step == 20


# what each page's blocks leave behind, beyond running: (the namespace, the folder) -> checked
PAGE_CHECKS = {
    "quickstart.md": lambda ns, folder: (
        ns["report"].n == len(ns["probes"])
        and ns["report"].forgotten > 0  # the run forgot something
        and (folder / "transitions.csv").is_file()
        and (folder / "base_answers.json").is_file()
    ),
    "measures.md": lambda ns, folder: ns["trajectory"].steps[0] == 0 and len(ns["trajectory"].steps) > 1,
    "trainer.md": lambda ns, folder: ns["callback"].config.eval_steps == 10,
    "watch.md": lambda ns, folder: (folder / "out" / "loop" / "forgetwatch" / "history.jsonl").is_file(),
    "lm-eval.md": lambda ns, folder: len(ns["tasks"]) > 0,
    "replay.md": lambda ns, folder: len(ns["pool"]) > 0,
    "capabilities.md": lambda ns, folder: (
        len(ns["tool_probes"]) == 4 and ns["calls"].watch.probes[0].kind.value == "tool call"
    ),
    "sampling.md": lambda ns, folder: (
        ns["before"].samples_correct.shape == (len(ns["probes"]), 3)
        and ns["report"].agreement[-1]["seeds"] == 3
        and ns["watching"].config.scoring.samples == 3
    ),
    "merge.md": lambda ns, folder: (
        ns["sweep"].reports[0].forgotten == 0
        and (folder / "sweep.csv").is_file()
        and "forgetwatch/merge/alpha" in ns["merging"].ending.metrics
        and (folder / "out-merge" / "forgetwatch" / "sweep.json").is_file()
    ),
}
WITH_PYTHON = [path.name for path in DOCS if any(not skip for _, skip in blocks("python", path.read_text("utf-8")))]


def test_every_page_with_python_is_checked_beyond_running():
    assert set(PAGE_CHECKS) <= set(WITH_PYTHON)


@pytest.mark.slow
@pytest.mark.parametrize("name", WITH_PYTHON)
def test_docs_python_blocks_run_in_order(name, readme_run):
    namespace, folder = readme_run
    namespace = dict(namespace)  # a page's names do not reach the next page
    done = {code for code, _ in blocks("python")}
    with contextlib.chdir(folder):
        run_blocks(page(name), name, namespace, done)
    assert PAGE_CHECKS.get(name, lambda ns, folder: True)(namespace, folder)


def probe_blocks(text: str) -> list[ProbeSet]:
    return [ProbeSet.from_records([json.loads(line) for line in code.splitlines()]) for code, _ in blocks("json", text)]


def test_json_blocks_are_valid_probe_files():
    for path in [README, *DOCS]:
        probe_blocks(path.read_text(encoding="utf-8"))  # every one loads
    [knowledge] = probe_blocks(page("probes.md"))
    assert len(knowledge) == 2 and not any(p.is_behaviour for p in knowledge)
    [behaviour] = probe_blocks(page("behaviour.md"))
    assert len(behaviour) == 3 and all(p.is_behaviour for p in behaviour)


@pytest.mark.parametrize("path", [README, *DOCS], ids=lambda path: path.name)
def test_no_count_of_tests_that_would_go_stale(path):
    """The suite grows with every change: the pages say how long it takes, not how many tests."""
    assert not re.search(r"\b\d[\d,]* tests\b", path.read_text(encoding="utf-8"))


# the docs' counts of shipped probe files: (the page, the words stating one, the file, what each probe is)
SHIPPED_COUNTS = [
    (
        "probes.md",
        r"(\d+) multiple-choice questions\s+on common facts",
        "configs/probes/general_knowledge.jsonl",
        "multiple choice",
    ),
    ("probes.md", r"(\d+) arithmetic word problems", "configs/probes/arithmetic.jsonl", "generative"),
    (
        "probes.md",
        r"--starter behaviour --out behaviour\.jsonl` writes (\d+)\s+behaviour probes",
        "forgetwatch/starters/behaviour.jsonl",
        "behaviour",
    ),
    (
        "probes.md",
        r"`--starter knowledge` writes (\d+) multiple-choice",
        "forgetwatch/starters/knowledge.jsonl",
        "multiple choice",
    ),
    (
        "probes.md",
        r"`--starter tools`\s+writes (\d+) tool-call probes",
        "forgetwatch/starters/tools.jsonl",
        "tool call",
    ),
    (
        "probes.md",
        r"`--starter multiturn`\s+writes (\d+) conversations",
        "forgetwatch/starters/multiturn.jsonl",
        "behaviour",
    ),
]


@pytest.mark.parametrize("name, words, path, kind", SHIPPED_COUNTS, ids=[path for _, _, path, _ in SHIPPED_COUNTS])
def test_counts_of_shipped_probes_are_true(name, words, path, kind):
    stated = re.search(words, page(name))
    assert stated, f"docs/{name} no longer states how many probes {path} holds: update SHIPPED_COUNTS"
    probes = ProbeSet.from_jsonl(ROOT / path)
    assert int(stated.group(1)) == len(probes), f"{path} holds {len(probes)} probes"
    kinds = {
        "multiple choice": lambda p: p.is_multiple_choice,
        "behaviour": lambda p: p.is_behaviour,
        "generative": lambda p: p.kind is ProbeKind.GENERATIVE,
        "tool call": lambda p: p.kind is ProbeKind.TOOL_CALL,
    }
    assert all(kinds[kind](p) for p in probes)


def _help(command: str, capsys) -> str:
    with pytest.raises(SystemExit):
        main([command, "--help"])
    return capsys.readouterr().out


def test_bash_lines_name_real_commands_flags_files_and_extras(capsys, monkeypatch):
    monkeypatch.chdir(ROOT)  # the lines name shipped files by relative path
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    texts = [path.read_text(encoding="utf-8") for path in [README, *DOCS]]
    lines = [line for text in texts for code, _ in blocks("bash", text) for line in code.splitlines() if line.strip()]
    assert any(line.startswith("forgetwatch ") for line in lines)
    for line in lines:
        line = line.split("#")[0]
        for part in line.split("&&"):
            words = shlex.split(part.replace("[", " ").replace("]", " "))
            environ = {}
            while "=" in words[0] and words[0].split("=")[0].isupper():  # VARIABLE=value command ...
                name, _, value = words.pop(0).partition("=")
                environ[name] = value
            if environ:
                FrameworkSettings.from_environ(environ)  # the plugin's own check
            if words[0] == "swift":  # ms-swift's command with forgetwatch's plugin file
                assert words[words.index("--external_plugins") + 1] == "$(forgetwatch plugin-path swift)", part
                assert words[words.index("--callbacks") + 1] == "forgetwatch", part
                assert main(["plugin-path", "swift"]) == 0 and capsys.readouterr().out.strip() == str(PLUGIN_FILE)
            elif words[:3] == ["pip", "install", "-e"]:
                extra = re.fullmatch(r"\.\[(\w+)\]", part.split()[-1].strip('"'))
                assert extra and extra.group(1) in extras, part
            elif words[0] == "python":
                assert (ROOT / words[1]).is_file(), part
            elif words[0].startswith(".ci/"):  # the project's own checks
                assert os.access(ROOT / words[0], os.X_OK) and len(words) == 1, part
            elif words[0] == "forgetwatch":
                text = _help(words[1], capsys)
                for flag in (w for w in words[2:] if w.startswith("--")):
                    assert flag in text, f"{flag} is not an option of 'forgetwatch {words[1]}'"
            else:
                assert words[0] == "pytest" and all(w in ("-m", "real", "framework") for w in words[1:]), part


def test_framework_yaml_blocks_are_checked_as_the_plugins_check_them(monkeypatch):
    monkeypatch.chdir(ROOT)  # the blocks name shipped files by relative path
    found = [yaml.safe_load(code) for code, _ in blocks("yaml", page("frameworks.md"))]
    assert len(found) == 3
    for config in found:
        if "ENV" in config:  # ms-swift
            FrameworkSettings.from_environ({k: str(v) for k, v in config["ENV"].items()})
            assert Path(config["external_plugins"]).name == PLUGIN_FILE.name and config["callbacks"] == ["forgetwatch"]
            continue
        FrameworkSettings.from_keys(config, "docs/frameworks.md")  # Axolotl, LLaMA-Factory
        for plugin in config.get("plugins", []):
            module, _, name = plugin.rpartition(".")
            source = ROOT / (module.replace(".", "/") + ".py")  # imported by Axolotl, which is not here
            assert f"class {name}(" in source.read_text(), plugin


def test_layout_tree_names_every_module():
    tree = next(code for code, _ in blocks("text", page("development.md")) if code.startswith("forgetwatch/"))
    named, folders = set(), []
    for line in tree.splitlines():
        name = line.split()[0]
        depth = (len(line) - len(line.lstrip())) // 2
        folders[depth:] = [name] if name.endswith("/") else []
        if name.endswith(".py"):
            named.add("".join(folders[:depth]) + name)
    modules = {str(p.relative_to(ROOT)) for p in (ROOT / "forgetwatch").rglob("*.py")}
    assert named == modules


def test_the_readme_is_short_and_links_pages_that_exist():
    text = README.read_text(encoding="utf-8")
    assert len(text.splitlines()) <= README_LINES, "the README grew: move the detail to a docs page"
    links = re.findall(r"\]\((docs/[^)#]+)", text)
    assert len(set(links)) >= 8
    assert all((ROOT / link).is_file() for link in links), links


def test_the_docs_site_names_every_page():
    nav = yaml.safe_load((ROOT / "mkdocs.yml").read_text(encoding="utf-8"))["nav"]
    pages = {page for entry in nav for page in entry.values()}
    assert pages == {path.name for path in DOCS} and len(pages) >= 8
    for path in DOCS:  # pictures a page shows are in the repository
        for picture in re.findall(r"!\[[^\]]*\]\(([^)]+)\)", path.read_text(encoding="utf-8")):
            assert (path.parent / picture).is_file(), f"{path.name} shows {picture}, which is not there"


def test_the_api_reference_shows_every_public_name():
    shown = set(re.findall(r"^::: forgetwatch\.(?:[\w.]+\.)?(\w+)$", page("api.md"), flags=re.M))
    assert shown == set(forgetwatch.__all__) - {"__version__"}
