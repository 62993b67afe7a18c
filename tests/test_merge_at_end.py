"""merge_at_end: when training ends the final weights are swept against the base kept since the start; the figures
logged equal a recount on models interpolated by hand, and the trainer's model and checkpoints stay as trained."""

from __future__ import annotations

import copy
import logging
import re

import pytest
import torch
from test_merge import by_hand, choice_probes, loss_per_token, same_answers
from trainers import make_trainer, run_view
from transformers import AutoModelForCausalLM

from forgetwatch import ForgetWatchCallback, MergeAtEnd, Scorer, Watch, compare, evaluate
from forgetwatch.store.write import RunStore

ALPHAS = (0.25, 0.5)
KEEP = 0.5


@pytest.fixture(scope="module")
def texts(toy):
    return toy.world.distraction_texts(n=6, seed=7)


def start(watch, plugin, model, tokenizer):
    """As a loop begins: the watch, then the merge beside it, on the model before training."""
    watch.start(model, tokenizer)
    plugin.begin(model, watch.view)


def finish(watch, plugin, model, step):
    """As a loop ends: the watch's last evaluation, then the merge on the final weights."""
    watch.finish(model, step)
    plugin.end(model, step)


def trained_by_hand(watch, plugin, toy):
    """A loop whose 'training' puts the tuned weights in the model the watch started on: the sweep is then
    between the toy's base and tuned models exactly."""
    model = copy.deepcopy(toy.base)
    start(watch, plugin, model, toy.tokenizer)
    model.load_state_dict(toy.tuned.state_dict())
    return model


def recount(toy, texts, alphas, keep):
    """Each α by hand: the chance-adjusted forgetting (else plain) and the gain; the α the rule picks."""
    base = evaluate(toy.base, toy.tokenizer, toy.probes, show_progress=False)
    losses = [loss_per_token(by_hand(toy.base, toy.tuned, a), toy.tokenizer, texts) for a in alphas]
    rows = []
    for a, loss in zip(alphas, losses):
        report = compare(base, evaluate(by_hand(toy.base, toy.tuned, a), toy.tokenizer, toy.probes))
        adjusted = report.forgetting_adjusted
        rows.append(
            (a, adjusted if adjusted == adjusted else report.forgetting, (losses[0] - loss) / (losses[0] - losses[-1]))
        )
    eligible = [r for r in rows if r[2] >= keep - 1e-9]
    return min(eligible, key=lambda r: (r[1], -r[0]))


@pytest.mark.slow
def test_a_loop_sweeps_the_final_weights_logs_the_choice_and_hands_the_model_back(toy, texts, tmp_path, capsys):
    plugin = MergeAtEnd(target=texts, alphas=ALPHAS, keep=KEEP, save=True)
    watch = Watch(toy.probes, output_dir=tmp_path / "fw", eval_steps=1)
    model = trained_by_hand(watch, plugin, toy)
    model.train()
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    finish(watch, plugin, model, 1)

    assert model.training and all(torch.equal(p, before[n]) for n, p in model.named_parameters())
    alpha, forgetting, gain = recount(toy, texts, (0.0, *ALPHAS, 1.0), KEEP)
    metrics = plugin.ending.metrics
    assert set(metrics) == {"forgetwatch/merge/alpha", "forgetwatch/merge/forgetting", "forgetwatch/merge/gain"}
    assert metrics["forgetwatch/merge/alpha"] == alpha
    assert metrics["forgetwatch/merge/forgetting"] == pytest.approx(forgetting)
    assert metrics["forgetwatch/merge/gain"] == pytest.approx(gain, rel=1e-4)
    assert f"merging with the base at alpha {alpha:g}" in capsys.readouterr().out
    assert plugin.ending.line in watch.summary()
    # the files: the table the report page shows, and the merged model, which scores as the model by hand
    assert (tmp_path / "fw" / "sweep.csv").is_file()
    assert plugin.sweep.to_dict(KEEP)["best"] == alpha
    merged = AutoModelForCausalLM.from_pretrained(tmp_path / "fw" / "merged")
    answers = evaluate(merged, toy.tokenizer, toy.probes, show_progress=False)
    assert same_answers(answers, evaluate(by_hand(toy.base, toy.tuned, alpha), toy.tokenizer, toy.probes))


@pytest.mark.slow
def test_a_failing_sweep_is_a_warning_and_the_model_is_handed_back(toy, texts, tmp_path, warned, monkeypatch):
    import forgetwatch.merge.sweep as sweep_module

    def broken(*args, **kwargs):
        raise RuntimeError("out of memory")

    watch, plugin = Watch(toy.probes, output_dir=tmp_path, eval_steps=1), MergeAtEnd(target=texts, alphas=ALPHAS)
    model = trained_by_hand(watch, plugin, toy)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    monkeypatch.setattr(sweep_module, "mean_token_loss", broken)  # fails at α = 0, the model moved
    finish(watch, plugin, model, 1)
    assert warned("merge_at_end", "RuntimeError")  # the plug-in and the error, as a warning
    assert plugin.ending is None and all(torch.equal(p, before[n]) for n, p in model.named_parameters())


def final_weights_and_checkpoint(toy, train_data, run, merge_at_end):
    callback = ForgetWatchCallback(toy.probes, eval_steps=3, merge_at_end=merge_at_end)
    trainer = make_trainer(toy, train_data, run, [callback], max_steps=6, save_strategy="steps", save_steps=6)
    trainer.train()
    weights = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    return weights, (run / "checkpoint-6" / "model.safetensors").read_bytes(), trainer, callback


@pytest.mark.slow
def test_a_trainer_logs_the_merge_and_keeps_its_model_and_checkpoints_as_trained(toy, train_data, texts, tmp_path):
    plain, plain_file, _, _ = final_weights_and_checkpoint(toy, train_data, tmp_path / "plain", None)
    merged, merged_file, trainer, callback = final_weights_and_checkpoint(
        toy, train_data, tmp_path / "merge", MergeAtEnd(target=texts, alphas=ALPHAS)
    )
    assert plain_file == merged_file
    assert all(torch.equal(p, plain[n]) for n, p in merged.items())
    logged = [r for r in trainer.state.log_history if "forgetwatch/merge/alpha" in r]
    assert len(logged) == 1 and logged[0]["step"] == 6
    assert logged[0]["forgetwatch/merge/alpha"] == callback.ending.metrics["forgetwatch/merge/alpha"]
    assert (tmp_path / "merge" / "forgetwatch" / "sweep.json").is_file()


@pytest.mark.slow
def test_a_peft_model_is_swept_by_its_adapters_scale_keeping_no_copy(toy, texts, tmp_path):
    from peft import LoraConfig, get_peft_model

    model = get_peft_model(
        copy.deepcopy(toy.base), LoraConfig(r=4, target_modules=["q_proj", "v_proj"], init_lora_weights=False)
    )
    plugin = MergeAtEnd(target=texts, alphas=ALPHAS)
    watch = Watch(toy.probes, output_dir=tmp_path, eval_steps=1, base="adapter_disabled")
    start(watch, plugin, model, toy.tokenizer)
    finish(watch, plugin, model, 1)
    assert plugin._base is None
    with model.disable_adapter():
        assert same_answers(plugin.sweep.answers[0], evaluate(model, toy.tokenizer, toy.probes, show_progress=False))
    assert same_answers(plugin.sweep.answers[-1], evaluate(model, toy.tokenizer, toy.probes, show_progress=False))


def context(toy, **changes):
    return run_view(toy.tokenizer, **{"scorer": Scorer(toy.tokenizer, toy.probes), **changes})


def test_a_resumed_run_of_full_weights_says_the_merge_is_off(toy, texts, caplog):
    plugin = MergeAtEnd(target=texts)
    with caplog.at_level(logging.WARNING, logger="forgetwatch"):
        plugin.begin(toy.base, context(toy, step=4))
    assert "merge_at_end is off for this resumed run" in caplog.text
    assert plugin.end(toy.base, 8) is None


def test_a_sharded_model_is_refused_before_training(toy, texts):
    with pytest.raises(ValueError, match="sharded"):
        MergeAtEnd(target=texts).begin(toy.base, context(toy, sharded=True))


@pytest.mark.parametrize(
    "make, error, message",
    [
        (lambda t: ForgetWatchCallback(t.probes, merge_at_end=True), TypeError, "MergeAtEnd"),  # what to give
        (lambda t: Watch(t.probes, output_dir="x", merge_at_end=True), TypeError, "'merge_at_end'"),
        (lambda t: MergeAtEnd(target=42), TypeError, "target"),
        (lambda t: MergeAtEnd(target=[]), ValueError, "target"),
        (lambda t: MergeAtEnd(target=["x"], keep=1.5), ValueError, "keep.*1.5"),
        (lambda t: MergeAtEnd(target=["x"], alphas=[2]), ValueError, r"alpha.*\b2\b"),
    ],
)
def test_bad_options_fail_before_any_work(toy, make, error, message):
    with pytest.raises(error, match=message):
        make(toy)


@pytest.mark.slow
def test_a_weight_unfrozen_during_training_moves_back_to_the_base_too(toy, texts, tmp_path, warned):
    plugin = MergeAtEnd(target=texts, alphas=(0.5,))
    watch = Watch(toy.probes, output_dir=tmp_path, eval_steps=1)
    model = copy.deepcopy(toy.base)
    model.model.embed_tokens.requires_grad_(False)  # frozen when training starts, trained later
    start(watch, plugin, model, toy.tokenizer)
    model.load_state_dict(toy.tuned.state_dict())  # every weight trained, the embeddings too
    finish(watch, plugin, model, 1)
    assert not warned("merge_at_end")
    assert same_answers(plugin.sweep.answers[0], evaluate(toy.base, toy.tokenizer, toy.probes, show_progress=False))
    half = evaluate(by_hand(toy.base, toy.tuned, 0.5), toy.tokenizer, toy.probes, show_progress=False)
    assert same_answers(plugin.sweep.answers[1], half)


@pytest.mark.slow
def test_alpha_zero_unlike_the_runs_base_is_a_warning_and_nothing_is_written(toy, texts, tmp_path, warned):
    from peft import LoraConfig, get_peft_model

    model = get_peft_model(
        copy.deepcopy(toy.base), LoraConfig(r=4, target_modules=["q_proj", "v_proj"], init_lora_weights=False)
    )
    plugin = MergeAtEnd(target=texts, alphas=(0.5,))
    watch = Watch(choice_probes(toy), output_dir=tmp_path, eval_steps=1, base="adapter_disabled")
    start(watch, plugin, model, toy.tokenizer)
    # the base model's embeddings trained in place, outside the adapter: no scale of the adapter undoes it
    with torch.no_grad():
        model.base_model.model.model.embed_tokens.weight.normal_(0, 1)
    finish(watch, plugin, model, 1)
    assert warned("merge_at_end", "ValueError", "alpha 0")
    assert plugin.ending is None and not (tmp_path / "sweep.json").exists()


def test_save_into_a_merged_that_is_a_file_is_refused_before_training(toy, texts, tmp_path):
    (tmp_path / "merged").write_text("not a folder")
    plugin = MergeAtEnd(target=texts, save=True)
    with pytest.raises(ValueError, match=re.escape(f"save=True): {tmp_path / 'merged'}")):  # the option; the path
        plugin.begin(toy.base, context(toy, store=RunStore(tmp_path)))


@pytest.mark.slow
def test_a_merged_model_not_written_is_a_warning_and_the_line_says_so(toy, texts, tmp_path, caplog):
    import resource
    import signal

    watch, plugin = Watch(toy.probes, output_dir=tmp_path, eval_steps=1), MergeAtEnd(texts, alphas=(0.5,), save=True)
    model = trained_by_hand(watch, plugin, toy)
    limits, handler = resource.getrlimit(resource.RLIMIT_FSIZE), signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (64 << 10, limits[1]))  # the disk fills up: no file over 64 KiB
    try:
        with caplog.at_level(logging.WARNING, logger="forgetwatch"):
            finish(watch, plugin, model, 1)
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, limits)
        signal.signal(signal.SIGXFSZ, handler)
    assert "the merged model was not written" in caplog.text
    assert "written to" not in plugin.ending.line and "the merged model was not written" in plugin.ending.line
    assert (tmp_path / "sweep.json").is_file() and not (tmp_path / "merged").exists()
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".merged")] == []
