"""forgetwatch merge: the table, sweep.csv / sweep.json, and the chosen model written whole; bad input in one line."""

from __future__ import annotations

import copy
import csv
import json

import pytest
import torch

from forgetwatch import evaluate
from forgetwatch.cli import main


@pytest.fixture(scope="module")
def inputs(toy, tmp_path_factory):
    root = tmp_path_factory.mktemp("merge_cli")
    probes = toy.probes.to_jsonl(root / "probes.jsonl")
    texts = root / "texts.jsonl"
    texts.write_text("".join(json.dumps({"text": t}) + "\n" for t in toy.world.distraction_texts(n=4, seed=7)))
    return str(probes), str(texts)


def lerped(base, tuned, alpha):
    model = copy.deepcopy(base)
    theirs = dict(tuned.named_parameters())
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(torch.lerp(p, theirs[name], alpha))
    return model


@pytest.mark.slow
def test_merge_writes_the_table_and_the_model_it_chose(toy, inputs, tmp_path, capsys):
    from transformers import AutoModelForCausalLM

    probes, texts = inputs
    out = tmp_path / "out"
    args = ["--base", toy.base_dir, "--model", toy.tuned_dir, "--probes", probes, "--target-texts", texts]
    assert main(["merge", *args, "--alphas", "0:1:0.5", "--keep", "0.8", "--out", str(out), "--no-progress"]) == 0
    printed = capsys.readouterr().out
    rows = list(csv.DictReader((out / "sweep.csv").open()))
    assert [float(r["alpha"]) for r in rows] == [0.0, 0.5, 1.0]
    chosen = json.loads((out / "sweep.json").read_text())
    best = chosen["best"]
    assert f"alpha {best:g}: target" in printed and chosen["keep"] == 0.8
    i = [float(r["alpha"]) for r in rows].index(best)
    assert float(rows[i]["gain"]) >= 0.8
    # the written model loads as any checkpoint and answers as the base and tuned weights lerped by hand
    written = AutoModelForCausalLM.from_pretrained(out / "merged")
    got = evaluate(written, toy.tokenizer, toy.probes, show_progress=False)
    want = evaluate(lerped(toy.base, toy.tuned, best), toy.tokenizer, toy.probes, show_progress=False)
    assert list(got.correct) == list(want.correct) and list(got.predicted) == list(want.predicted)
    assert int(rows[i]["forgotten"]) == sum(
        b and not a
        for b, a in zip(evaluate(toy.base, toy.tokenizer, toy.probes, show_progress=False).correct, got.correct)
    )


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--alphas", "0:2:0.5"], "every alpha is in [0, 1]"),
        (["--alphas", "a:b"], "write FROM:TO:STEP"),
        (["--keep", "1.5"], "--keep"),
    ],
)
def test_bad_flags_are_one_line(toy, inputs, tmp_path, capsys, extra, message):
    probes, texts = inputs
    args = ["--base", toy.base_dir, "--model", toy.tuned_dir, "--probes", probes, "--target-texts", texts]
    with pytest.raises(SystemExit) as exc:
        main(["merge", *args, *extra, "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and message in err and len(err.strip().splitlines()) == 1


def test_bad_inputs_are_one_line_before_any_model_loads(toy, inputs, tmp_path, capsys, monkeypatch):
    import forgetwatch.cli as cli

    monkeypatch.setattr(cli, "load_model", lambda *a, **k: pytest.fail("a model was loaded"))
    probes, texts = inputs
    bad_texts = tmp_path / "bad.jsonl"
    bad_texts.write_text('{"text": "fine"}\n{"txt": "typo"}\n')
    cases = [
        (["--model", toy.tuned_dir, "--target-texts", str(tmp_path / "gone.txt")], "no such file"),
        (["--model", toy.tuned_dir, "--target-texts", str(bad_texts)], "line 2: field 'text'"),
        (["--adapter", str(tmp_path), "--target-texts", texts], "no adapter_config.json"),
    ]
    for extra, message in cases:
        code = main(["merge", "--base", toy.base_dir, "--probes", probes, *extra, "--out", str(tmp_path / "o")])
        err = capsys.readouterr().err
        assert code == 2 and message in err and len(err.strip().splitlines()) == 1, err
