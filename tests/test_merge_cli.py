"""forgetwatch merge: the table, sweep.csv / sweep.json, and the chosen model written whole; bad input in one line."""

from __future__ import annotations

import copy
import csv
import json

import pytest
import torch

from forgetwatch import evaluate
from forgetwatch.cli import main
from forgetwatch.cli.merge import parse_alphas


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
        (["--alphas", "0:inf:0.5"], "every alpha is in [0, 1]"),
        (["--alphas", "0:1:nan"], "write FROM:TO:STEP"),
        (["--alphas", "0:1:1e-7"], "10000001 alphas; a sweep tries at most 101"),
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


def test_a_range_of_alphas_takes_its_end_where_the_step_overshoots_it():
    assert parse_alphas("0:1:0.6") == [0.0, 0.6, 1.0]
    assert parse_alphas("0:0.3:0.1") == [0.0, 0.1, 0.2, 0.3, 1.0]  # 0.3 / 0.1 is just under 3 in floating point
    assert parse_alphas("0:1:0.01") == [i / 100 for i in range(101)]


def test_bad_inputs_are_one_line_before_any_model_loads(toy, inputs, tmp_path, capsys, monkeypatch):
    import forgetwatch.cli as cli

    monkeypatch.setattr(cli, "load_model", lambda *a, **k: pytest.fail("a model was loaded"))
    probes, texts = inputs
    bad_texts = tmp_path / "bad.jsonl"
    bad_texts.write_text('{"text": "fine"}\n{"txt": "typo"}\n')
    upper = tmp_path / "held.JSONL"  # read as JSONL all the same
    upper.write_text('{"text": "fine"}\n{"txt": "typo"}\n')
    (tmp_path / "nul.txt").write_text("fine\nbinary \x00 data\n")
    (tmp_path / "lone.jsonl").write_text('{"text": "fine"}\n{"text": "a \\ud800 b"}\n')
    (tmp_path / "nowhere").symlink_to(tmp_path / "gone")
    (tmp_path / "taken").mkdir()
    (tmp_path / "taken" / "merged").write_text("a file")
    model = ["--model", toy.tuned_dir]
    cases = [
        ([*model, "--target-texts", str(tmp_path / "gone.txt")], "no such file"),
        ([*model, "--target-texts", str(bad_texts)], "line 2: field 'text'"),
        ([*model, "--target-texts", str(upper)], f"--target-texts {upper}: line 2: field 'text'"),
        ([*model, "--target-texts", str(tmp_path / "nul.txt")], "nul.txt: line 2: has a NUL character at character 7"),
        ([*model, "--target-texts", str(tmp_path / "lone.jsonl")], "lone.jsonl: line 2: field 'text': has a lone"),
        (["--adapter", str(tmp_path), "--target-texts", texts], "no adapter_config.json"),
        ([*model, "--target-texts", texts, "--out", str(tmp_path / "nowhere")], "gone, which does not exist"),
        ([*model, "--target-texts", texts, "--out", str(tmp_path / "taken")], "merged: exists and is not a folder"),
    ]
    for extra, message in cases:
        out = [] if "--out" in extra else ["--out", str(tmp_path / "o")]
        code = main(["merge", "--base", toy.base_dir, "--probes", probes, *extra, *out])
        err = capsys.readouterr().err
        assert code == 2 and message in err and len(err.strip().splitlines()) == 1, err


def main_err(argv, capsys):
    """The error line of a command that loaded models (their loading bars before it), exit code 2."""
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return err.strip().splitlines()[-1]


def test_an_adapter_trained_on_another_base_is_one_line(toy, inputs, tmp_path, capsys):
    from peft import LoraConfig, get_peft_model

    other = get_peft_model(toy.world.model(toy.tokenizer, hidden=32), LoraConfig(r=4, target_modules=["q_proj"]))
    other.save_pretrained(tmp_path / "adapter")
    probes, texts = inputs
    argv = ["merge", "--base", toy.base_dir, "--adapter", str(tmp_path / "adapter"), "--probes", probes]
    err = main_err([*argv, "--target-texts", texts, "--out", str(tmp_path / "o")], capsys)
    assert err.startswith(f"forgetwatch: error: --adapter {tmp_path / 'adapter'}: the adapter does not fit")
    assert "size mismatch" in err


@pytest.mark.slow
def test_a_model_not_written_says_so_and_leaves_nothing(toy, inputs, tmp_path, capsys):
    import resource
    import signal

    probes, texts = inputs
    out = tmp_path / "out"
    argv = ["merge", "--base", toy.base_dir, "--model", toy.tuned_dir, "--probes", probes, "--target-texts", texts]
    limits, handler = resource.getrlimit(resource.RLIMIT_FSIZE), signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (64 << 10, limits[1]))  # the disk fills up: no file over 64 KiB
    try:
        err = main_err([*argv, "--alphas", "0,1", "--out", str(out), "--no-progress"], capsys)
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, limits)
        signal.signal(signal.SIGXFSZ, handler)
    assert err.startswith(f"forgetwatch: error: {out / 'merged'}: the merged model was not written")
    written = {p.name for p in out.iterdir()}
    assert {"sweep.csv", "sweep.json"} <= written and not any("merged" in name for name in written)
