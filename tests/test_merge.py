"""merge_sweep: every α's answers and target loss equal a recount on a model interpolated by hand; the model
is handed back bit for bit; LoRA is swept by its scale and agrees with the merged full weights."""

from __future__ import annotations

import copy
import re

import pytest
import torch

from forgetwatch import ProbeSet, compare, evaluate
from forgetwatch.merge import merge_sweep
from forgetwatch.merge.sweep import fresh_copy
from forgetwatch.merge.weights import layer_groups

ALPHAS = (0.0, 0.25, 0.5, 1.0)


@pytest.fixture(scope="module")
def texts(toy):
    return toy.world.distraction_texts(n=6, seed=7)


@pytest.fixture(scope="module")
def sweep(toy, texts):
    """The sweep, and whether it handed the model back as it was: parameters bit for bit, training mode."""
    before = {n: p.detach().clone() for n, p in toy.tuned.named_parameters()}
    toy.tuned.train()
    made = merge_sweep(toy.base, toy.tuned, toy.tokenizer, toy.probes, target=texts, alphas=ALPHAS, by_layer=True)
    made.handed_back = toy.tuned.training and all(torch.equal(p, before[n]) for n, p in toy.tuned.named_parameters())
    toy.tuned.eval()
    return made


def by_hand(base, tuned, alpha, revert=()):
    """A new model at ``alpha``: every parameter lerped on its own (those named in ``revert`` left at the base)."""
    model = copy.deepcopy(base)
    tuned_params = dict(tuned.named_parameters())
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name not in revert:
                p.copy_(torch.lerp(p, tuned_params[name], alpha))
    return model


def loss_per_token(model, tokenizer, texts):
    """Each text on its own (no padding): the mean of the per-token losses over all texts' tokens."""
    total, count = 0.0, 0
    with torch.no_grad():
        for text in texts:
            ids = torch.tensor([tokenizer(text)["input_ids"]])
            loss = model(input_ids=ids, labels=ids).loss
            total += loss.item() * (ids.shape[1] - 1)
            count += ids.shape[1] - 1
    return total / count


def same_answers(a, b):
    return list(a.correct) == list(b.correct) and list(a.predicted) == list(b.predicted)


@pytest.mark.slow
def test_each_alpha_equals_a_model_interpolated_by_hand(toy, texts, sweep):
    assert sweep.alphas == list(ALPHAS)
    base_answers = evaluate(toy.base, toy.tokenizer, toy.probes, show_progress=False)
    for alpha, answers, report, target in zip(sweep.alphas, sweep.answers, sweep.reports, sweep.target):
        model = by_hand(toy.base, toy.tuned, alpha)
        recount = evaluate(model, toy.tokenizer, toy.probes, show_progress=False)
        assert same_answers(answers, recount), alpha
        assert report.forgotten_ids == compare(base_answers, recount).forgotten_ids
        assert target == pytest.approx(loss_per_token(model, toy.tokenizer, texts), rel=1e-5)


@pytest.mark.slow
def test_alpha_zero_is_the_base_and_one_the_tuned_model(toy, sweep):
    assert same_answers(sweep.answers[0], evaluate(toy.base, toy.tokenizer, toy.probes, show_progress=False))
    assert same_answers(sweep.answers[-1], evaluate(toy.tuned, toy.tokenizer, toy.probes, show_progress=False))
    assert sweep.reports[0].forgotten == 0 and sweep.reports[0].gained == 0
    assert sweep.reports[-1].forgotten > 0  # the toy's tuned model forgets: the sweep has something to undo
    assert sweep.gain[0] == 0 and sweep.gain[-1] == 1


@pytest.mark.slow
def test_the_model_is_handed_back_bit_for_bit(sweep):
    assert sweep.handed_back


@pytest.mark.slow
def test_best_keeps_the_gain_it_promises_with_the_least_forgetting(sweep):
    for keep in (0.5, 0.9, 1.0):
        best = sweep.best(keep)
        i = sweep.alphas.index(best)
        assert sweep.gain[i] >= keep
        eligible = [j for j, g in enumerate(sweep.gain) if g is not None and g >= keep]
        assert all(sweep.forgetting(i) <= sweep.forgetting(j) for j in eligible)
    with pytest.raises(ValueError, match="keep.*1.5"):
        sweep.best(1.5)


@pytest.mark.slow
def test_merged_scores_as_the_sweep_did(toy, sweep):
    model = sweep.merged(0.5)
    answers = evaluate(model, toy.tokenizer, toy.probes, show_progress=False)
    assert same_answers(answers, sweep.answers[sweep.alphas.index(0.5)])
    assert model is not toy.tuned


@pytest.mark.slow
def test_by_layer_rows_equal_a_group_reverted_by_hand(toy, texts, sweep):
    groups = layer_groups([n for n, _ in toy.tuned.named_parameters()])
    assert [row.group for row in sweep.layers] == list(groups)
    assert {"embeddings", "block 0", "head"} <= set(groups)
    forgotten = set(sweep.reports[-1].forgotten_ids)
    base_answers = sweep.answers[0]
    for row in sweep.layers:
        model = by_hand(toy.base, toy.tuned, 1.0, revert=set(groups[row.group]))
        report = compare(base_answers, evaluate(model, toy.tokenizer, toy.probes, show_progress=False))
        assert row.forgotten == report.forgotten, row.group
        assert row.restored == len(forgotten - set(report.forgotten_ids)), row.group
        assert row.target == pytest.approx(loss_per_token(model, toy.tokenizer, texts), rel=1e-5)


@pytest.mark.slow
def test_a_target_probe_set_is_scored_as_accuracy(toy):
    target = ProbeSet(list(toy.probes)[:10], source="target")
    sweep = merge_sweep(toy.base, toy.tuned, toy.tokenizer, toy.probes, target=target, alphas=(0.5,))
    assert sweep.target_kind == "accuracy"
    for alpha, accuracy in zip(sweep.alphas, sweep.target):
        model = by_hand(toy.base, toy.tuned, alpha)
        assert accuracy == evaluate(model, toy.tokenizer, target, show_progress=False).accuracy


@pytest.mark.slow
def test_the_table_as_csv(sweep, tmp_path):
    text = sweep.to_csv(tmp_path / "sweep.csv")
    lines = text.splitlines()
    assert lines[0].startswith("alpha,forgotten,gained,forgetting")
    assert len(lines) == 1 + len(ALPHAS)
    assert (tmp_path / "sweep.csv").read_text() == text
    assert "nan" not in text.lower()
    assert f"alpha {sweep.best():g}: target" in sweep.summary()


@pytest.mark.parametrize(
    ("change", "message"),  # message: the argument the error names, and the value or bound
    [
        ({"alphas": (0.5, 1.5)}, "alpha.*1.5"),
        ({"alphas": "0:1"}, "alphas"),
        ({"target": 3}, "target"),
        ({"target": []}, "target"),
        ({"probes": []}, "probes"),
        ({"base": "other architecture"}, "configuration"),
        ({"base": "bfloat16"}, "bfloat16.*float32"),
        ({"max_length": 0}, "max_length.*0"),
        ({"target": ["fine", "a\x00b"]}, "target text 1"),
        ({"alphas": [i / 200 for i in range(201)]}, "201.*101"),
    ],
)
def test_bad_input_is_one_clear_error_before_any_model_work(toy, texts, change, message, monkeypatch):
    calls = []
    monkeypatch.setattr(torch.nn.Module, "__call__", lambda *a, **k: calls.append(1))
    base = toy.base
    if change.get("base") == "other architecture":
        base = toy.world.model(toy.tokenizer, hidden=32)
    elif change.get("base"):
        base = copy.deepcopy(toy.base).to(torch.bfloat16)
    kwargs = {"target": texts, "alphas": ALPHAS, **{k: v for k, v in change.items() if k != "base"}}
    probes = kwargs.pop("probes", toy.probes)
    with pytest.raises((ValueError, TypeError), match=message):
        merge_sweep(base, toy.tuned, toy.tokenizer, probes, **kwargs)
    assert calls == []


def test_a_copy_of_a_model_accelerate_wrapped_runs_its_own_weights(toy, fresh_accelerate_state):
    from accelerate import Accelerator

    wrapped = Accelerator(cpu=True, mixed_precision="bf16").prepare_model(copy.deepcopy(toy.tuned))
    assert "forward" in vars(wrapped)  # accelerate's autocast wrapper, bound to this object
    made = fresh_copy(wrapped)
    made.load_state_dict(toy.base.state_dict())
    ids = torch.tensor([toy.tokenizer("the capital of")["input_ids"]])
    with torch.no_grad():
        assert torch.equal(made(input_ids=ids).logits, toy.base(input_ids=ids).logits)


@pytest.mark.slow
def test_lora_is_swept_by_its_scale_and_agrees_with_the_merged_weights(toy, texts):
    peft = pytest.importorskip("peft")
    model = peft.get_peft_model(copy.deepcopy(toy.base), peft.LoraConfig(r=4, target_modules=["q_proj", "v_proj"]))
    torch.manual_seed(0)
    with torch.no_grad():  # an adapter that changes the answers: its B matrices, zero when made, set at random
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.5)
    before = {n: (p.data_ptr(), p.detach().clone()) for n, p in model.named_parameters()}
    sweep = merge_sweep(None, model, toy.tokenizer, toy.probes, target=texts, alphas=(0.5,))
    for name, p in model.named_parameters():  # no weight moved or copied in place
        assert p.data_ptr() == before[name][0] and torch.equal(p, before[name][1])
    merged = copy.deepcopy(model).merge_and_unload()
    full = merge_sweep(toy.base, merged, toy.tokenizer, toy.probes, target=texts, alphas=(0.5,))
    assert [r.forgotten_ids for r in sweep.reports] == [r.forgotten_ids for r in full.reports]
    assert sweep.target == pytest.approx(full.target, rel=1e-4)
    assert same_answers(sweep.answers[0], evaluate(toy.base, toy.tokenizer, toy.probes, show_progress=False))
    half = sweep.merged(0.5)  # the rescaled adapter
    answers = evaluate(half, toy.tokenizer, toy.probes, show_progress=False)
    assert list(answers.correct) == list(sweep.answers[1].correct)


def test_where_training_gained_nothing_best_keeps_a_target_as_good_as_the_tuned_models(sweep):
    import dataclasses

    worse = [sweep.target[0] + 1 - i * 0.1 for i in range(len(sweep.alphas))]  # loss: higher at alpha 1 than the base
    lost = dataclasses.replace(sweep, target=worse, gain=[None] * len(sweep.alphas))
    best = lost.best(0.9)
    eligible = [i for i, t in enumerate(worse) if t <= worse[-1]]
    assert sweep.alphas.index(best) in eligible
    assert lost.forgetting(sweep.alphas.index(best)) == min(lost.forgetting(i) for i in eligible)


def test_layer_groups_follow_the_models_order_one_block_or_a_span_a_group():
    names = ["embed.weight", *(f"model.layers.{i}.mlp.weight" for i in range(5)), "norm.weight", "lm_head.weight"]
    assert list(layer_groups(names)) == ["embeddings", *(f"block {i}" for i in range(5)), "head"]
    spans = layer_groups(names, 2)
    assert list(spans) == ["embeddings", "blocks 0-1", "blocks 2-3", "blocks 4-5", "head"]
    assert spans["blocks 2-3"] == ["model.layers.2.mlp.weight", "model.layers.3.mlp.weight"]
    assert spans["head"] == ["norm.weight", "lm_head.weight"]


def choice_probes(toy):
    """The toy's multiple-choice probes: a model far from the base generates nothing but junk, up to the limit."""
    return ProbeSet([p for p in toy.probes if p.choices], source="toy choices")


def peft_model(toy, **config):
    """A LoRA adapter on a copy of the toy's base whose every weight is set at random (it changes the answers)."""
    peft = pytest.importorskip("peft")
    model = peft.get_peft_model(
        copy.deepcopy(toy.base), peft.LoraConfig(r=4, target_modules=["q_proj", "v_proj"], **config)
    )
    torch.manual_seed(0)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.5)
    return model


@pytest.mark.slow
def test_an_adapters_copy_of_a_module_moves_back_to_the_modules_own_weights(toy, texts, tmp_path):
    from peft import PeftModel

    probes = choice_probes(toy)
    model = peft_model(toy, modules_to_save=["lm_head"])
    with torch.no_grad():  # the adapter's trained copy of the head, far from the head's own weights
        model.base_model.model.lm_head.modules_to_save["default"].weight.normal_(0, 0.5)
    sweep = merge_sweep(None, model, toy.tokenizer, probes, target=texts, alphas=(0.5,), by_layer=True)
    assert same_answers(sweep.answers[0], evaluate(toy.base, toy.tokenizer, probes, show_progress=False))
    assert same_answers(sweep.answers[-1], evaluate(model, toy.tokenizer, probes, show_progress=False))
    assert "head" in [row.group for row in sweep.layers]  # reverting the head moves its copy
    merged = copy.deepcopy(model).merge_and_unload()
    full = merge_sweep(toy.base, merged, toy.tokenizer, probes, target=texts, alphas=(0.5,))
    assert [r.forgotten_ids for r in sweep.reports] == [r.forgotten_ids for r in full.reports]
    assert sweep.target == pytest.approx(full.target, rel=1e-4)
    # the adapter saved at 0.5 (its B matrices scaled, its head's copy lerped) scores as the sweep did
    sweep.save(0.5, tmp_path / "half")
    saved = PeftModel.from_pretrained(copy.deepcopy(toy.base), tmp_path / "half")
    assert same_answers(evaluate(saved, toy.tokenizer, probes, show_progress=False), sweep.answers[1])
    assert same_answers(evaluate(sweep.merged(0.5), toy.tokenizer, probes, show_progress=False), sweep.answers[1])


@pytest.mark.parametrize(
    ("config", "names"),
    [
        ({"bias": "all"}, "bias='all'"),
        ({"bias": "lora_only"}, "bias='lora_only'"),
        ({"trainable_token_indices": [3, 4]}, "TrainableTokens"),
        ({"use_dora": True}, "DoRA"),
    ],
)
def test_an_adapter_that_trains_what_cannot_move_back_is_refused_before_any_scoring(
    toy, texts, config, names, monkeypatch
):
    model = peft_model(toy, **config)
    monkeypatch.setattr(torch.nn.Module, "__call__", lambda *a, **k: pytest.fail("a model was run"))
    with pytest.raises(ValueError, match="merge_sweep: .*merge_and_unload") as caught:
        merge_sweep(None, model, toy.tokenizer, toy.probes, target=texts)
    assert names in str(caught.value)


def test_alpha_zero_judged_otherwise_than_the_base_is_an_error_beyond_its_noise(toy):
    from forgetwatch.merge.sweep import check_alpha_zero

    base = evaluate(toy.base, toy.tokenizer, toy.probes, show_progress=False)
    tuned = evaluate(toy.tuned, toy.tokenizer, toy.probes, show_progress=False)
    flips = sum(a != b for a, b in zip(base.correct, tuned.correct))
    assert flips > 0
    check_alpha_zero(base, base)
    with pytest.raises(ValueError, match=rf"\b{flips}\b.*\b{len(base)}\b"):  # how many of how many probes
        check_alpha_zero(tuned, base)
    base.meta["noise_flips"] = flips  # the base's own scoring flips as many: within its noise
    check_alpha_zero(tuned, base)
    base.meta["noise_flips"] = flips - 1
    with pytest.raises(ValueError, match=rf"\b{flips}\b.*\b{flips - 1}\b"):  # the flips, and what the noise allows
        check_alpha_zero(tuned, base)


@pytest.mark.slow
def test_a_merged_model_that_cannot_be_written_leaves_nothing_and_says_so(sweep, tmp_path):
    import resource
    import signal

    folder = tmp_path / "merged"
    folder.mkdir()
    (folder / "earlier.txt").write_text("an earlier merge")
    limits, handler = resource.getrlimit(resource.RLIMIT_FSIZE), signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (64 << 10, limits[1]))  # a disk that fills up after 64 KiB a file
    try:
        with pytest.raises(OSError, match=re.escape(str(folder))):
            sweep.save(0.5, folder)
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, limits)
        signal.signal(signal.SIGXFSZ, handler)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["merged"]  # no temporary folder left
    assert [p.name for p in folder.iterdir()] == ["earlier.txt"]  # the earlier one as it was
    sweep.save(0.5, folder)
    assert (folder / "model.safetensors").is_file() and not (folder / "earlier.txt").exists()
    (tmp_path / "file").write_text("")
    with pytest.raises(OSError, match=re.escape(str(tmp_path / "file"))):
        sweep.save(0.5, tmp_path / "file")


def test_target_texts_are_cut_to_the_models_context(toy):
    from forgetwatch import Scoring
    from forgetwatch.merge.sweep import Target

    gpt2 = toy.world.model(toy.tokenizer, arch="gpt2").eval()  # 256 positions
    text = " ".join(toy.world.distraction_texts(n=40, seed=1))
    ids = toy.tokenizer(text)["input_ids"]
    assert len(ids) > gpt2.config.n_positions
    measured = Target(gpt2, toy.tokenizer, [text], Scoring(), max_length=1024)(gpt2)
    cut = torch.tensor([ids[: gpt2.config.n_positions]])
    with torch.no_grad():
        assert measured == pytest.approx(gpt2(input_ids=cut, labels=cut).loss.item(), rel=1e-5)
