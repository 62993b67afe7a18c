"""training_rows: the rows and target positions read from real trainers' data loaders, built and not trained."""

from __future__ import annotations

import copy

import numpy as np
import pytest
from transformers import Trainer, TrainingArguments

from forgetwatch.run.train_kl.rows import MAX_TOKENS, TrainRows, training_rows
from forgetwatch.toy import ToyWorld

datasets = pytest.importorskip("datasets")
trl = pytest.importorskip("trl")
datasets.disable_progress_bars()

COMMON = dict(
    use_cpu=True, bf16=False, report_to=[], save_strategy="no", max_steps=1, disable_tqdm=True, dataloader_num_workers=0
)
DIRECT = "Watch.start(train_rows=...) takes rows directly"


@pytest.fixture(scope="module")
def world():
    world = ToyWorld(seed=0)
    tok = world.tokenizer()
    return world, tok, world.model(tok)


def plain(world, path, data) -> Trainer:
    _, tok, model = world
    args = TrainingArguments(str(path), remove_unused_columns=False, **COMMON)  # every column, as TRL's trainers keep
    return Trainer(model=model, args=args, train_dataset=data, processing_class=tok)


def sft(world, path, data, **settings):
    _, tok, model = world
    args = trl.SFTConfig(str(path), per_device_train_batch_size=4, max_length=64, **COMMON, **settings)
    return trl.SFTTrainer(model=model, args=args, processing_class=tok, train_dataset=data)


def grpo(world, path, prompts, tok=None):
    _, toy_tok, model = world
    args = trl.GRPOConfig(
        str(path), per_device_train_batch_size=4, num_generations=2, max_completion_length=6, **COMMON
    )
    return trl.GRPOTrainer(
        model=model,
        reward_funcs=lambda completions, **kw: [1.0] * len(completions),
        args=args,
        processing_class=tok or toy_tok,
        train_dataset=datasets.Dataset.from_dict({"prompt": prompts}),
    )


def rows_of(trainer, tokenizer, n: int, seed: int):
    """training_rows on what the callback reads: the trainer's data loader's dataset and its arguments."""
    dataset = None if trainer.train_dataset is None else trainer.get_train_dataloader().dataset
    return training_rows(dataset, n, seed, args=trainer.args, tokenizer=tokenizer or trainer.processing_class)


def sample(size: int, n: int, seed: int) -> list[int]:
    return sorted(np.random.default_rng([seed, size]).choice(size, min(n, size), replace=False).tolist())


def test_a_trainer_on_input_ids_and_labels_measures_the_labelled_tokens(world, tmp_path):
    _, tok, _ = world
    rows = [tok(t)["input_ids"] for t in world[0].distraction_texts(n=20)]
    labels = [[-100] * 4 + ids[4:] for ids in rows]
    trainer = plain(world, tmp_path, datasets.Dataset.from_dict({"input_ids": rows, "labels": labels}))
    got, reason = rows_of(trainer, tok, n=8, seed=3)
    assert reason == "" and got.source == "trainer" and got.complete
    assert got.rows == [(rows[i], 4) for i in sample(20, 8, 3)]


def test_without_labels_every_token_but_the_first_is_a_target_and_padding_is_dropped(world, tmp_path):
    _, tok, _ = world
    texts = world[0].distraction_texts(n=6)
    padded = tok(texts, padding="max_length", max_length=24)  # right padding, kept in the rows
    trainer = plain(world, tmp_path, datasets.Dataset.from_dict(dict(padded)))
    got, _ = rows_of(trainer, tok, n=10, seed=0)
    assert got.rows == [(tok(t)["input_ids"], 1) for t in texts]  # n above the size: every row, in order


def test_sft_on_text_measures_every_token_but_the_first(world, tmp_path):
    _, tok, _ = world
    texts = world[0].distraction_texts(n=12)
    got, _ = rows_of(sft(world, tmp_path, datasets.Dataset.from_dict({"text": texts})), None, n=4, seed=0)
    assert got.source == "sft"
    assert got.rows == [(tok(texts[i] + tok.eos_token)["input_ids"], 1) for i in sample(12, 4, 0)]


def test_sft_on_prompt_and_completion_measures_the_completion_only(world, tmp_path):
    _, tok, _ = world
    pairs = [(f"Compute {a} plus {b}.", f" The sum is {a + b}.") for a, b in [(1, 2), (17, 5), (30, 12), (8, 8)]]
    data = datasets.Dataset.from_list([{"prompt": p, "completion": c} for p, c in pairs])
    got, _ = rows_of(sft(world, tmp_path, data), tok, n=4, seed=0)
    for (ids, start), (prompt, completion) in zip(got.rows, pairs):
        assert start == len(tok(prompt)["input_ids"]) > 1
        assert ids == tok(prompt + completion + tok.eos_token)["input_ids"]


def test_a_packed_sft_row_keeps_its_first_sequence(world, tmp_path):
    _, tok, _ = world
    texts = world[0].distraction_texts(n=16)
    trainer = sft(world, tmp_path, datasets.Dataset.from_dict({"text": texts}), packing=True)
    first = trainer.train_dataset[sample(len(trainer.train_dataset), 1, 0)[0]]
    got, _ = rows_of(trainer, tok, n=1, seed=0)
    (ids, start), length = got.rows[0], first["seq_lengths"][0]
    assert len(first["input_ids"]) > length and ids == first["input_ids"][:length] and start == 1


def test_dpo_measures_the_chosen_answer_after_the_prompt(world, tmp_path):
    _, tok, model = world
    rows = [{"prompt": f"{a} plus", "chosen": " one.", "rejected": " two."} for a in ("One", "Two", "Three", "Four")]
    args = trl.DPOConfig(str(tmp_path), per_device_train_batch_size=4, max_length=32, **COMMON)
    trainer = trl.DPOTrainer(
        model=model,
        ref_model=copy.deepcopy(model),
        args=args,
        processing_class=tok,
        train_dataset=datasets.Dataset.from_list(rows),
    )
    got, _ = rows_of(trainer, tok, n=8, seed=0)
    assert got.source == "dpo" and len(got.rows) == 4
    for (ids, start), row in zip(got.rows, rows):
        prompt = tok(row["prompt"])["input_ids"]
        assert start == len(prompt) and ids[:start] == prompt
        assert tok.decode(ids[start:]) == " one." + tok.eos_token


def test_older_trl_column_names_are_read(world, tmp_path):
    _, tok, _ = world
    prompt, chosen = [1, 40, 41], [50, 51, 2]
    old = {"prompt_input_ids": [prompt], "chosen_input_ids": [chosen], "rejected_input_ids": [[60, 2]]}
    got, _ = rows_of(plain(world, tmp_path, datasets.Dataset.from_dict(old)), tok, n=4, seed=0)
    assert (got.source, got.rows) == ("dpo", [(prompt + chosen, 3)])
    # before TRL 0.12: chosen_input_ids held the prompt, and chosen_labels masked it
    oldest = {
        "prompt_input_ids": [prompt],
        "chosen_input_ids": [prompt + chosen],
        "chosen_labels": [[-100] * 3 + chosen],
        "chosen_attention_mask": [[1] * 6],
    }
    got, _ = rows_of(plain(world, tmp_path, datasets.Dataset.from_dict(oldest)), tok, n=4, seed=0)
    assert (got.source, got.rows) == ("dpo", [(prompt + chosen, 3)])
    # older SFT: completion_mask and assistant_masks kept as columns, the labels built by the collator
    ids = list(range(1, 13))
    masks = {"input_ids": [ids], "completion_mask": [[0] * 5 + [1] * 7], "assistant_masks": [[1] * 12]}
    got, _ = rows_of(plain(world, tmp_path, datasets.Dataset.from_dict(masks)), tok, n=4, seed=0)
    assert got.rows == [(ids, 5)]


def test_targets_that_are_not_one_tail_are_measured_on_their_last_run(world, tmp_path):
    _, tok, _ = world
    ids = list(range(1, 15))
    # two assistant turns (tokens 3-5 and 9-11), then a template's closing tokens that are not targets
    turns = [0, 0, 0, 1, 1, 1, 0, 0, 0, 1, 1, 1, 0, 0]
    data = datasets.Dataset.from_dict({"input_ids": [ids], "assistant_masks": [turns]})
    got, _ = rows_of(plain(world, tmp_path, data), tok, n=1, seed=0)
    assert got.rows == [(ids[:12], 9)]  # the first turn is context, the tokens after the last target are dropped


def test_rows_are_cut_to_their_first_512_tokens(world, tmp_path):
    _, tok, _ = world
    long = [int(t) for t in np.random.default_rng(0).integers(3, 600, size=MAX_TOKENS + 200)]
    data = {
        "input_ids": [long, long],
        "labels": [[-100] * 10 + long[10:], [-100] * (MAX_TOKENS + 5) + long[MAX_TOKENS + 5 :]],
    }
    got, _ = rows_of(plain(world, tmp_path, datasets.Dataset.from_dict(data)), tok, n=2, seed=0)
    assert got.rows == [(long[:MAX_TOKENS], 10)]  # the second row's targets all lie past the cut: left out
    data["labels"] = data["labels"][1:] * 2
    got, reason = rows_of(plain(world, tmp_path, datasets.Dataset.from_dict(data)), tok, n=2, seed=0)
    assert got is None and "has a target token in its first 512" in reason and DIRECT in reason


def test_grpo_gives_the_prompts_and_leaves_the_completion_to_the_caller(world, tmp_path):
    _, tok, _ = world
    prompts = [t.split(" plus")[0] + " plus" for t in world[0].distraction_texts(n=10)]
    got, _ = rows_of(grpo(world, tmp_path, prompts), None, n=6, seed=1)
    assert got.source == "grpo" and got.completion_tokens == 6 and not got.complete
    expected = [tok(prompts[i])["input_ids"] for i in sample(10, 6, 1)]
    assert got.rows == [(ids, len(ids)) for ids in expected]


def test_grpo_renders_a_conversational_prompt_with_the_generation_prompt(world, tmp_path):
    _, toy_tok, _ = world
    tok = copy.deepcopy(toy_tok)
    tok.chat_template = (
        "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
        "{% if add_generation_prompt %}assistant:{% endif %}"
    )
    prompts = [[{"role": "user", "content": f"Compute {a} plus 1."}] for a in range(5)]
    got, _ = rows_of(grpo(world, tmp_path, prompts, tok=tok), tok, n=5, seed=0)
    for (ids, start), prompt in zip(got.rows, prompts):
        assert start == len(ids) and tok.decode(ids).endswith("assistant:")
        assert (
            ids
            == tok.apply_chat_template(prompt, add_generation_prompt=True, tokenize=True, return_dict=True)["input_ids"]
        )


def test_the_sample_is_seeded_capped_and_the_same_on_a_second_call(world, tmp_path):
    _, tok, _ = world
    rows = [tok(t)["input_ids"] for t in world[0].distraction_texts(n=40)]
    trainer = plain(world, tmp_path, datasets.Dataset.from_dict({"input_ids": rows}))
    first, again, other = (rows_of(trainer, tok, n=7, seed=s)[0] for s in (0, 0, 1))
    assert first == again and first.rows != other.rows and len(first.rows) == 7
    assert first.rows == [(rows[i], 1) for i in sample(40, 7, 0)]
    assert len(rows_of(trainer, tok, n=100, seed=0)[0].rows) == 40


@pytest.mark.parametrize("case", ["iterable", "none", "raw text", "unreadable", "zero"])
def test_what_cannot_be_read_gives_no_rows_and_one_line_saying_why(world, tmp_path, case):
    _, tok, _ = world
    texts = world[0].distraction_texts(n=8)
    data = {
        "iterable": datasets.Dataset.from_dict(
            {"input_ids": [tok(t)["input_ids"] for t in texts]}
        ).to_iterable_dataset(),
        "none": None,
        "raw text": datasets.Dataset.from_dict({"text": texts}),  # a collator would tokenize it on the fly
        "unreadable": [{"input_ids": "not token ids"}] * 4,
        "zero": datasets.Dataset.from_dict({"input_ids": [[1, 2, 3]]}),
    }[case]
    trainer = plain(world, tmp_path, data)
    got, reason = rows_of(trainer, tok, n=0 if case == "zero" else 8, seed=0)
    assert got is None and reason and "\n" not in reason
    expected = {
        "iterable": "IterableDataset) cannot be sampled by index",
        "none": "no training dataset",
        "raw text": "columns: text",
        "unreadable": "could not be read (ValueError",
        "zero": "n = 0",
    }[case]
    assert expected in reason
    assert case == "zero" or DIRECT in reason


def test_train_rows_holds_its_fields():
    rows = TrainRows([([1, 2, 3], 1)], "grpo", completion_tokens=6)
    assert (rows.rows, rows.source, rows.completion_tokens, rows.complete) == ([([1, 2, 3], 1)], "grpo", 6, False)


def test_kto_measures_the_completion_after_the_prompt(world, tmp_path):
    _, tok, model = world
    rows = [
        {"prompt": f"{a} plus", "completion": " one.", "label": a == "One"} for a in ("One", "Two", "Three", "Four")
    ]
    args = trl.KTOConfig(str(tmp_path), per_device_train_batch_size=4, max_length=32, **COMMON)
    trainer = trl.KTOTrainer(
        model=model,
        ref_model=copy.deepcopy(model),
        args=args,
        processing_class=tok,
        train_dataset=datasets.Dataset.from_list(rows),
    )
    got, _ = rows_of(trainer, tok, n=8, seed=0)
    assert got.source == "kto" and len(got.rows) == 4
    for (ids, start), row in zip(got.rows, rows):
        assert ids[:start] == tok(row["prompt"])["input_ids"] and tok.decode(ids[start:]).startswith(" one.")
