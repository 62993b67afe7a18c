"""The data of the tasks in this folder: forgetwatch's shipped probe files (../probes/), read
from beside this file so that the tasks load from any working directory. The first five rows of
each file are the few-shot examples (the ``train`` split), the rest the documents scored."""

from __future__ import annotations

import json
from pathlib import Path

import datasets

PROBES = Path(__file__).resolve().parent.parent / "probes"


def _splits(name: str) -> datasets.DatasetDict:
    rows = [json.loads(line) for line in (PROBES / name).read_text(encoding="utf-8").splitlines() if line.strip()]
    for row in rows:  # forgetwatch's own keys that lm-eval does not use
        row.pop("extract", None)
    return datasets.DatasetDict(
        {"train": datasets.Dataset.from_list(rows[:5]), "test": datasets.Dataset.from_list(rows[5:])}
    )


def general_knowledge(**kwargs) -> datasets.DatasetDict:
    return _splits("general_knowledge.jsonl")


def arithmetic(**kwargs) -> datasets.DatasetDict:
    return _splits("arithmetic.jsonl")
