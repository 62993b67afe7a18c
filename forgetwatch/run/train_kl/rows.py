"""A seeded sample of the trainer's training rows as token ids and the index of their first target token, for
train KL (which columns are read: docs/trainer.md, "Which training rows train KL reads")."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from forgetwatch.run.train_kl import MAX_TOKENS, TrainRows

#: the most tokens of the base's greedy completion asked for after a GRPO prompt
MAX_COMPLETION = 128


def training_rows(
    dataset: Any, n: int, seed: int, *, args: Any = None, tokenizer: Any = None, trainer: Any = None
) -> tuple[TrainRows | None, str]:
    """At most ``n`` rows of ``dataset``, a seeded sample, as ``(TrainRows, "")``, or ``(None, reason)``: never raises.
    ``args`` say how TRL trains on the rows; ``tokenizer`` and ``trainer`` (tools, chat template) render GRPO prompts."""
    try:
        found = _training_rows(dataset, n, seed, args, tokenizer, trainer)
    except Exception as err:  # monitoring, not training: an odd dataset turns the signal off, never the run
        reason = " ".join(f"{type(err).__name__}: {err}".split())[:200]
        found = f"the training data could not be read ({reason})"
    if isinstance(found, TrainRows):
        return found, ""
    return None, f"{found}: Watch.start(train_rows=...) takes rows directly"


def _training_rows(dataset: Any, n: int, seed: int, args: Any, tokenizer: Any, trainer: Any) -> TrainRows | str:
    if n <= 0:
        return "no rows asked for (n = 0)"
    if dataset is None:
        return "the trainer has no training dataset"
    try:
        size = len(dataset)
        dataset.__getitem__  # noqa: B018  (a sized dataset without indexing cannot be sampled either)
    except (TypeError, AttributeError):
        return f"the training dataset (a {type(dataset).__name__}) cannot be sampled by index"
    if size == 0:
        return "the training dataset is empty"
    columns = _columns(dataset)
    if columns is None:
        return "the training dataset's rows are not dicts of columns"
    layout = _layout(columns, args, tokenizer, trainer)
    if layout is None:
        shown = ", ".join(columns[:8]) + (", ..." if len(columns) > 8 else "")
        return f"the training dataset has no token ids this can read (columns: {shown})"
    source, needed, read = layout
    if source == "grpo" and tokenizer is None:
        return "the training prompts are text and no tokenizer was given"
    indices = np.sort(np.random.default_rng([seed, size]).choice(size, min(n, size), replace=False))
    if hasattr(dataset, "select_columns"):  # a datasets.Dataset: read only the columns used (no images)
        dataset = dataset.select_columns(needed)
    rows = [row for row in (read(dataset[int(i)]) for i in indices) if row is not None]
    if not rows:
        return f"none of the {len(indices)} sampled rows has a target token in its first {MAX_TOKENS}"
    if source == "grpo":
        limit = getattr(args, "max_completion_length", None)
        return TrainRows(rows, source, min(limit, MAX_COMPLETION) if limit else MAX_COMPLETION)
    return TrainRows(rows, source)


def _columns(dataset: Any) -> list[str] | None:
    names = getattr(dataset, "column_names", None)
    if isinstance(names, list) and all(isinstance(c, str) for c in names):
        return names
    first = dataset[0]  # a torch Dataset or a list of dicts: the first row's keys
    return [str(k) for k in first] if isinstance(first, Mapping) else None


def _layout(columns: list[str], args: Any, tokenizer: Any, trainer: Any):
    """``(source, columns read, reader of a row)`` for the dataset's columns, or ``None``."""
    have = set(columns)
    if "input_ids" in have:
        source = "sft" if any(c.__name__ == "SFTConfig" for c in type(args).__mro__) else "trainer"
        extra = ("labels", "completion_mask", "assistant_masks", "attention_mask", "seq_lengths", "position_ids")
        # TRL folds completion_mask into the labels only with completion_only_loss on (None: on)
        completion_only = getattr(args, "completion_only_loss", None) is not False
        return (
            source,
            ["input_ids", *(c for c in extra if c in have)],
            _sequence_reader("input_ids", "labels", completion_only=completion_only),
        )
    if {"chosen_input_ids", "chosen_labels"} <= have:  # TRL before 0.12: the prompt inside chosen_input_ids
        needed = [c for c in ("chosen_input_ids", "chosen_labels", "chosen_attention_mask") if c in have]
        return "dpo", needed, _sequence_reader("chosen_input_ids", "chosen_labels", "chosen_attention_mask")
    for prompt, answer, source in (
        ("prompt_ids", "chosen_ids", "dpo"),
        ("prompt_input_ids", "chosen_input_ids", "dpo"),
        ("prompt_ids", "completion_ids", "kto"),
    ):
        if {prompt, answer} <= have:
            return source, [prompt, answer], _pair_reader(prompt, answer)
    if "prompt" in have and not any(c.endswith("_ids") for c in have):
        return "grpo", ["prompt"], _prompt_reader(args, tokenizer, trainer)
    return None


def _ints(values: Any) -> list[int]:
    values = values.tolist() if hasattr(values, "tolist") else values or ()
    return [int(v) for v in values]


def _sequence_reader(
    ids_key: str, labels_key: str, attention_key: str = "attention_mask", completion_only: bool = True
):
    def read(example: Mapping) -> tuple[list[int], int] | None:
        ids = _ints(example[ids_key])
        if example.get(labels_key) is not None:
            targets = [label != -100 for label in _ints(example[labels_key])]
        else:
            masks = []
            if example.get("completion_mask") is not None and completion_only:
                masks.append(_ints(example["completion_mask"]))
            if example.get("assistant_masks") is not None:
                masks.append(_ints(example["assistant_masks"]))
            targets = [all(bits) for bits in zip(*masks, strict=False)] if masks else [True] * len(ids)
        end = min(len(ids), len(targets), _first_sequence_end(example, len(ids)))
        begin = 0
        if example.get(attention_key) is not None:  # padding stored in the row: drop it at either end
            attended = [i for i, bit in enumerate(_ints(example[attention_key])[:end]) if bit]
            if not attended:
                return None
            begin, end = attended[0], attended[-1] + 1
        return _row(ids[begin:end], targets[begin:end])

    return read


def _first_sequence_end(example: Mapping, end: int) -> int:
    """Where a packed row's first sequence ends (``end`` when the row is not packed)."""
    if lengths := _ints(example.get("seq_lengths")):
        return lengths[0]
    return next((i for i, p in enumerate(_ints(example.get("position_ids"))) if p == 0 and i > 0), end)


def _pair_reader(prompt_key: str, answer_key: str):
    def read(example: Mapping) -> tuple[list[int], int] | None:
        prompt, answer = _ints(example[prompt_key]), _ints(example[answer_key])
        return _row(prompt + answer, [False] * len(prompt) + [True] * len(answer))

    return read


def _row(ids: list[int], targets: Sequence[bool]) -> tuple[list[int], int] | None:
    """``(ids, start)`` of the last run of targets in the first MAX_TOKENS tokens, or ``None``."""
    ids, targets = ids[:MAX_TOKENS], list(targets[:MAX_TOKENS])
    marked = [i for i in range(1, len(ids)) if targets[i]]
    if not marked:
        return None
    end = marked[-1] + 1
    start = end - 1
    while start > 1 and targets[start - 1]:
        start -= 1
    return ids[:end], start


def _prompt_reader(args: Any, tokenizer: Any, trainer: Any):
    """A GRPO prompt's tokens, as its trainer tokenizes them."""
    template = getattr(trainer, "chat_template_kwargs", None) or getattr(args, "chat_template_kwargs", None)
    rendering = {
        "tools": getattr(trainer, "tools", None) or None,
        "chat_template": getattr(trainer, "chat_template", None),
        **(template if isinstance(template, Mapping) else {}),
    }
    keep = getattr(args, "max_prompt_length", None)

    def read(example: Mapping) -> tuple[list[int], int] | None:
        prompt = example["prompt"]
        if isinstance(prompt, str):
            ids = _first(tokenizer(text=prompt)["input_ids"])
        else:  # a conversation, ending on the generation prompt
            encoded = tokenizer.apply_chat_template(
                list(prompt), add_generation_prompt=True, tokenize=True, return_dict=True, **rendering
            )
            ids = _first(encoded["input_ids"])
        if isinstance(keep, int) and keep > 0:  # older TRL kept a prompt's last max_prompt_length tokens
            ids = ids[-keep:]
        ids = ids[: MAX_TOKENS - 1]  # room for at least one completion token
        return (ids, len(ids)) if ids else None

    return read


def _first(ids: Any) -> list[int]:
    # a processor may answer one text with a batch of one
    ids = ids.tolist() if hasattr(ids, "tolist") else ids
    return _ints(ids[0] if len(ids) and isinstance(ids[0], list) else ids)
