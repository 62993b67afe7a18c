"""Dataset layouts as probe records (lm-eval's zero-shot MMLU, ARC, HellaSwag, GSM8K prompts; IFEval and
harmful-request behaviour probes; a column mapping), which ``ProbeSet.from_hf`` validates as any probe row."""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any

from forgetwatch.probes.schema import is_int, type_name

ColumnSpec = str | Callable[[Mapping[str, Any]], Any]
_LETTERS = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"


class RowProblem(Exception):
    """A row a preset or column mapping cannot turn into a probe record: ``args`` is ``(field, message)``."""


def _need(row: Mapping[str, Any], column: str, kind: type | None = None) -> Any:
    """``row[column]``; ``kind``: ``str``, or ``list`` (of strings)."""
    if column not in row:
        columns = ", ".join(map(str, row)) or "(none)"
        raise RowProblem(column, f"missing column '{column}'; this row has columns: {columns}")
    value = row[column]
    if kind is str and not isinstance(value, str):
        raise RowProblem(column, f"must be a string, got {type_name(value)}")
    if kind is list and not (isinstance(value, (list, tuple)) and all(isinstance(v, str) for v in value)):
        raise RowProblem(column, f"must be a list of strings, got {type_name(value)}")
    return list(value) if kind is list else value


def _mmlu(row: Mapping[str, Any], index: int) -> dict[str, Any]:
    subject, question, options = _need(row, "subject", str), _need(row, "question", str), _need(row, "choices", list)
    if len(options) > len(_LETTERS):
        raise RowProblem("choices", f"has {len(options)} choices; at most {len(_LETTERS)} can be lettered")
    letters = list(_LETTERS[: len(options)])
    listed = "".join(f"\n{letter}. {option}" for letter, option in zip(letters, options))
    header = f"The following are multiple choice questions (with answers) about {subject.replace('_', ' ')}."
    return {
        "id": f"mmlu/{subject}/{index}",
        "question": f"{header}\n\n{question.strip()}{listed}\nAnswer:",
        "choices": letters,  # lm-eval scores the letter, not the option text
        "answer": _need(row, "answer"),
        "category": subject,
    }


#: The zero-shot chain-of-thought instruction of ``mmlu_cot`` (after Harmon et al.'s protocol): reason, then end
#: with one line "Answer: X", read back by ``extract="answer_line"``.
COT_INSTRUCTION = (
    "Answer the following multiple choice question. Think step by step, then write your final answer on the last "
    'line, in the form "Answer: $LETTER" where LETTER is one of {letters}.'
)


def _mmlu_cot(row: Mapping[str, Any], index: int) -> dict[str, Any]:
    """The MMLU row as a generative probe: reason, then end with ``Answer: X`` naming the answer's letter."""
    record = _mmlu(row, index)
    letters = record["choices"]
    answer = record["answer"]
    if not is_int(answer) or not 0 <= answer < len(letters):
        raise RowProblem("answer", f"must be the index of one of the {len(letters)} choices, got {answer!r}")
    options = "".join(f"\n{letter}) {option}" for letter, option in zip(letters, row["choices"]))
    instruction = COT_INSTRUCTION.format(letters="".join(letters))
    return {
        "id": f"mmlu_cot/{row['subject']}/{index}",
        "question": f"{instruction}\n\nQuestion: {row['question'].strip()}{options}",
        "answer": letters[answer],
        "extract": "answer_line",
        "category": row["subject"],
    }


def _arc(row: Mapping[str, Any], index: int) -> dict[str, Any]:
    choices = _need(row, "choices")
    if not isinstance(choices, Mapping) or "text" not in choices or "label" not in choices:
        raise RowProblem("choices", "must be a mapping with 'text' and 'label' lists (the ai2_arc layout)")
    labels = list(choices["label"])
    key = _need(row, "answerKey")
    if key not in labels:
        raise RowProblem("answerKey", f"{key!r} is not one of the choice labels {labels}")
    return {
        "id": _need(row, "id"),
        "question": f"Question: {_need(row, 'question', str)}\nAnswer:",
        "choices": list(choices["text"]),
        "answer": labels.index(key),
        "category": "arc",
    }


def _hellaswag_clean(text: str) -> str:
    """lm-evaluation-harness's hellaswag text preprocessing (WikiHow markup removal)."""
    return re.sub(r"\[.*?\]", "", text.strip().replace(" [title]", ". ")).replace("  ", " ")


def _hellaswag(row: Mapping[str, Any], index: int) -> dict[str, Any]:
    activity, ctx_a, ctx_b = (_need(row, column, str) for column in ("activity_label", "ctx_a", "ctx_b"))
    endings, label = _need(row, "endings", list), _need(row, "label")
    try:
        answer = int(label)
    except (TypeError, ValueError):
        raise RowProblem(
            "label", f"{label!r} is not an integer; the hellaswag test split has no labels, use the validation split"
        ) from None
    ind = row.get("ind")
    return {
        "id": f"hellaswag/{index if ind is None else ind}",
        "question": _hellaswag_clean(f"{activity}: {ctx_a} {ctx_b.capitalize()}"),
        "choices": [_hellaswag_clean(e) for e in endings],
        "answer": answer,
        "category": "hellaswag",
    }


def _gsm8k(row: Mapping[str, Any], index: int) -> dict[str, Any]:
    solution = _need(row, "answer", str)
    if "####" not in solution:
        raise RowProblem("answer", "has no final '#### <number>' line (the gsm8k answer layout)")
    return {
        "id": f"gsm8k/{index}",
        "question": f"Question: {_need(row, 'question', str)}\nAnswer:",
        "answer": solution.rsplit("####", 1)[1].strip().replace(",", ""),
        "extract": "number",
        "category": "gsm8k",
    }


def _ifeval(row: Mapping[str, Any], index: int) -> dict[str, Any]:
    """google/IFEval: a behaviour probe with an ``ifeval`` check (Arrow's padded None kwargs dropped)."""
    names = _need(row, "instruction_id_list", list)
    kwargs = _need(row, "kwargs")
    listed = isinstance(kwargs, (list, tuple)) and len(kwargs) == len(names)
    if not listed or not all(isinstance(k, Mapping) for k in kwargs):
        raise RowProblem("kwargs", f"must be a list of {len(names)} mappings, one per instruction")
    instructions = [
        {"id": name, "kwargs": {k: v for k, v in given.items() if v is not None}} for name, given in zip(names, kwargs)
    ]
    return {
        "id": f"ifeval/{row.get('key', index)}",
        "question": _need(row, "prompt", str),
        "check": {"ifeval": instructions},
        "category": names[0].split(":")[0] if names else "ifeval",
    }


def _harmful(row: Mapping[str, Any], index: int) -> dict[str, Any]:
    """HarmBench-style: ``Behavior`` must be refused (after ``ContextString``), by ``SemanticCategory``."""
    request = _need(row, "Behavior", str)
    context = row.get("ContextString") or ""
    return {
        "id": f"harmful/{row.get('BehaviorID', index)}",
        "question": f"{context}\n\n{request}" if context else request,
        "check": {"refuses": True},
        "category": row.get("SemanticCategory") or "harmful",
    }


PRESETS: dict[str, Callable[[Mapping[str, Any], int], dict[str, Any]]] = {
    "mmlu": _mmlu,
    "mmlu_cot": _mmlu_cot,
    "arc": _arc,
    "hellaswag": _hellaswag,
    "gsm8k": _gsm8k,
    "ifeval": _ifeval,
    "harmful": _harmful,
}


def map_columns(row: Mapping[str, Any], index: int, columns: Mapping[str, ColumnSpec]) -> dict[str, Any]:
    record: dict[str, Any] = {}
    for fld, spec in columns.items():
        if callable(spec):
            try:
                record[fld] = spec(row)
            except Exception as exc:  # a user's lambda failing on one row is a row problem
                raise RowProblem(fld, f"column function raised {type(exc).__name__}: {exc}") from None
        else:
            record[fld] = _need(row, spec)
    record.setdefault("id", f"{index}")
    return record
