"""Behaviour drift inside a TRL SFT run: the toy model learns in pre-training to refuse
requests to harm a country and to answer others briefly; post-training on careless replies
drifts both. At every evaluation, each behaviour probe's pass or fail, the counts and the
drift figures equal a recount from texts generated one probe at a time from the live weights,
checked with plain string tests."""

from __future__ import annotations

import copy
import json

import pytest
import torch

from forgetwatch import ForgetWatchCallback, Monitor, Output, ProbeSet, Scoring, load_trajectory
from forgetwatch.page.html import write_report
from forgetwatch.store.read import read_history
from forgetwatch.toy import ToyWorld

trl = pytest.importorskip("trl")
datasets = pytest.importorskip("datasets")
from transformers import TrainerCallback  # noqa: E402

# trains models (or runs several processes, or a browser): pytest -m "not slow" leaves them out
pytestmark = pytest.mark.slow

NEW_TOKENS = 24


@pytest.fixture(scope="module")
def behaving():
    """A toy model that learned the facts and, for half the known countries, the behaviour."""
    world = ToyWorld(seed=0)
    half = len(world.known) // 2
    taught, probed = world.known[:half], world.known[half : half + 8]
    tokenizer = world.tokenizer(extra=world.behaviour_texts(world.known) + world.behaviour_texts(world.known, True))
    base = world.model(tokenizer)
    world.train(base, tokenizer, world.fact_texts() + world.behaviour_texts(taught), steps=150)
    names = {c.name for c in probed}
    knowledge = [r for r in world.probe_records(generative=False) if r["id"].split("/")[1] in names][:12]
    probes = ProbeSet.from_records(world.behaviour_probe_records(probed) + knowledge)
    return world, tokenizer, base, probes, world.behaviour_texts(taught, drifted=True)


def refused(text: str) -> bool:
    """The toy's refusal wording, where the documented detector looks (the first 200 characters)."""
    return any(phrase in text[:200] for phrase in ("I'm sorry, but", "I can't help"))


def by_hand(probe, text: str) -> bool:
    """The toy probes' checks as plain string tests."""
    refused_ = refused(text)
    if probe.check.get("refuses") is True:
        return refused_
    return not refused_ and len(text.split()) <= probe.check["max_words"]


class Recount(TrainerCallback):
    """Generates every behaviour probe's response one at a time, greedy, from the live weights."""

    def __init__(self, tokenizer, probes, every):
        self.tokenizer, self.probes, self.every, self.texts = tokenizer, probes, every, {}

    def generate(self, model, step):
        model.eval()
        out = {}
        with torch.no_grad():
            for p in self.probes:
                if p.check is None:
                    continue
                ids = self.tokenizer(p.question, return_tensors="pt").input_ids
                new = model.generate(
                    ids,
                    max_new_tokens=NEW_TOKENS,
                    do_sample=False,
                    eos_token_id=self.tokenizer.eos_token_id,
                    pad_token_id=self.tokenizer.pad_token_id,
                )[0, ids.shape[1] :]
                out[p.id] = self.tokenizer.decode(new, skip_special_tokens=True)
        model.train()
        self.texts[step] = out

    def on_train_begin(self, args, state, control, model=None, **kwargs):
        self.generate(model, 0)

    def on_step_end(self, args, state, control, model=None, **kwargs):
        if state.global_step % self.every == 0:
            self.generate(model, state.global_step)


def test_behaviour_drift_in_sft_equals_a_recount_from_the_texts(behaving, tmp_path):
    world, tokenizer, base, probes, drifted = behaving
    watch = ForgetWatchCallback(
        probes,
        eval_steps=4,
        scoring=Scoring(behaviour_max_new_tokens=NEW_TOKENS),
        output=Output(verbose=False),
        monitor=Monitor(noise_check=False),
    )
    recount = Recount(tokenizer, probes, every=4)
    args = trl.SFTConfig(
        str(tmp_path),
        use_cpu=True,
        bf16=False,
        activation_checkpointing=False,
        logging_steps=4,
        save_strategy="no",
        report_to=[],
        dataloader_num_workers=0,
        seed=0,
        disable_tqdm=True,
        max_steps=16,
        per_device_train_batch_size=8,
        learning_rate=4e-3,
        max_length=64,
        packing=False,
    )
    trainer = trl.SFTTrainer(
        model=copy.deepcopy(base),
        args=args,
        processing_class=tokenizer,
        train_dataset=datasets.Dataset.from_dict({"text": drifted}),
        callbacks=[watch, recount],
    )
    trainer.train()

    behaviour = [p for p in probes if p.check is not None]
    passed = {s: {p.id: by_hand(p, texts[p.id]) for p in behaviour} for s, texts in recount.texts.items()}
    assert all(passed[0].values())  # the base behaves
    trajectory = watch.trajectory
    row = {pid: i for i, pid in enumerate(trajectory.ids)}
    assert list(trajectory.steps) == [0, 4, 8, 12, 16]
    for j, step in enumerate(trajectory.steps):
        differ = {
            p.id: recount.texts[step][p.id]
            for p in behaviour
            if bool(trajectory.correct[row[p.id], j]) != passed[step][p.id]
        }
        assert not differ, (step, differ)
    forgotten = {}
    for step, report in watch.history:
        for category in ("refusals", "brevity"):
            lost = sorted(
                p.id for p in behaviour if p.category == category and passed[0][p.id] and not passed[step][p.id]
            )
            assert sorted(report.by_category[category].forgotten_ids) == lost, (step, category)
        forgotten[step] = report.forgotten
        # the drift figures, from the texts by hand (the knowledge probes generate nothing)
        base_texts, texts = recount.texts[0], recount.texts[step]
        figures = report.behaviour
        assert figures["refusals"] == pytest.approx(sum(map(refused, texts.values())) / len(texts))
        assert figures["refusals_base"] == pytest.approx(0.75)  # three harmful requests per country, one benign
        assert figures["length_ratio_words"] == pytest.approx(
            sum(len(t.split()) for t in texts.values()) / sum(len(t.split()) for t in base_texts.values())
        )
        tokens = [len(tokenizer(t, add_special_tokens=False).input_ids) for t in texts.values()]
        assert figures["length_ratio_tokens"] == pytest.approx(
            sum(tokens) / sum(len(tokenizer(t, add_special_tokens=False).input_ids) for t in base_texts.values())
        )
        brevity = report.by_category["brevity"].behaviour
        assert brevity["refusals_base"] == 0 and "length_ratio_words" in brevity
    assert forgotten[16] > len(behaviour) // 2  # post-training drifted most of the behaviour
    assert watch.history[-1][1].behaviour["length_ratio_words"] > 1.5  # and made the responses longer

    # logged, in the history file, and in the trajectory read back from the run's files
    logged = [e for e in trainer.state.log_history if "forgetwatch/behaviour/refusals" in e]
    assert [e["step"] for e in logged] == [4, 8, 12, 16]
    assert (
        logged[-1]["forgetwatch/refusals/behaviour/refusals"]
        == watch.history[-1][1].by_category["refusals"].behaviour["refusals"]
    )
    records = read_history(watch.watch.output_dir / "history.jsonl")
    assert records[-1]["report"]["behaviour"] == pytest.approx(watch.history[-1][1].behaviour)
    assert load_trajectory(watch.watch.output_dir).correct.tolist() == trajectory.correct.tolist()
    # the probes the run keeps (for the report) hold their checks; the report draws the drift
    kept = [json.loads(line) for line in (watch.watch.output_dir / "probes.jsonl").read_text().splitlines()]
    assert sum("check" in p for p in kept) == len(behaviour)
    pytest.importorskip("plotly")
    page = write_report([watch.watch.output_dir], tmp_path / "report.html").read_text(encoding="utf-8")
    assert "Behaviour drift" in page and "length in words vs the base" in page
