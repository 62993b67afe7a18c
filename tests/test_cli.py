"""The command line on saved checkpoints: output, files, and clean errors."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest

from forgetwatch import Answers, ProbeSet, compare, evaluate
from forgetwatch.cli import main


@pytest.fixture(scope="module")
def probe_file(toy, tmp_path_factory):
    path = tmp_path_factory.mktemp("cli") / "probes.jsonl"
    toy.probes.to_jsonl(path)
    return str(path)


def run(capsys, *argv):
    code = main([*argv, "--no-progress"])
    out, err = capsys.readouterr()
    return code, out, err


def test_compare_prints_the_table_and_writes_results(toy, probe_file, tmp_path, capsys):
    code, out, err = run(capsys, "compare", "--base", toy.base_dir, "--model", toy.tuned_dir,
                         "--probes", probe_file, "--out", str(tmp_path), "--batch-size", "8")
    assert code == 0, err
    for category in ("overall", "capitals", "colors", "rivers"):
        assert category in out
    names = {p.name for p in tmp_path.iterdir()}
    assert names == {"base_answers.json", "model_answers.json", "samples.csv", "transitions.csv", "summary.json"}

    # the same numbers as scoring the in-memory models directly
    probes = ProbeSet.from_jsonl(probe_file)
    expected = compare(evaluate(toy.base, toy.tokenizer, probes, show_progress=False),
                       evaluate(toy.tuned, toy.tokenizer, probes, show_progress=False))
    summary = json.loads((tmp_path / "summary.json").read_text())["report"]
    for key in ("n", "forgotten", "gained", "kept", "never", "forgotten_ids", "gained_ids"):
        assert summary[key] == getattr(expected, key), key
    assert expected.forgotten > 0  # the tuned model forgot something
    assert Answers.load(tmp_path / "base_answers.json", probes=probes).correct.tolist() == \
        evaluate(toy.base, toy.tokenizer, probes, show_progress=False).correct.tolist()
    lines = (tmp_path / "samples.csv").read_text().splitlines()
    assert len(lines) == len(probes) + 1
    # the questions and raw outputs beside each sample, numbers rounded (no 0.24000000000000002)
    import csv

    with open(tmp_path / "samples.csv", newline="", encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    tuned = Answers.load(tmp_path / "model_answers.json", probes=probes)
    assert [r["question"] for r in rows] == [p.question for p in probes]
    assert [r["output_after"] for r in rows] == [o or "" for o in tuned.outputs] and any(tuned.outputs)
    numbers = [r[k] for r in rows for k in ("gold_logprob_before", "gold_logprob_after") if r[k]]
    assert numbers and all(len(x.lstrip("-").replace(".", "").lstrip("0")) <= 6 for x in numbers)
    assert all(float(r["gold_logprob_after"]) == pytest.approx(lp, rel=1e-5) for r, lp in zip(rows, tuned.gold_logprob))


def test_evaluate_snapshot_then_compare_against_it(toy, probe_file, tmp_path, capsys):
    snapshot = tmp_path / "base.npz"
    code, out, err = run(capsys, "evaluate", "--model", toy.base_dir, "--probes", probe_file, "--out", str(snapshot))
    assert code == 0, err
    assert "accuracy" in out and snapshot.is_file()
    code, out, err = run(capsys, "compare", "--base", str(snapshot), "--model", toy.tuned_dir, "--probes", probe_file)
    assert code == 0, err
    assert "overall" in out


@pytest.mark.parametrize("case", ["missing-model", "not-a-model-dir", "missing-probes", "bad-probes",
                                  "bad-out", "out-is-a-file", "other-probes-snapshot",
                                  "other-options-snapshot", "bad-batch-size"])
def test_errors_are_one_clear_line_with_exit_code_2(toy, probe_file, tmp_path, capsys, case):
    probes = ["--probes", probe_file]
    if case == "missing-model":
        argv = ["compare", "--base", str(tmp_path / "nope"), "--model", toy.tuned_dir, *probes]
        expect = "no such directory"
    elif case == "not-a-model-dir":
        argv = ["evaluate", "--model", str(tmp_path), *probes, "--out", str(tmp_path / "a.json")]
        expect = "no config.json"
    elif case == "missing-probes":
        argv = ["evaluate", "--model", toy.base_dir, "--probes", str(tmp_path / "none.jsonl"),
                "--out", str(tmp_path / "a.json")]
        expect = "no such file"
    elif case == "bad-probes":
        bad = tmp_path / "bad.jsonl"
        bad.write_text('{"id": "a", "question": "q", "choices": ["x", "y"], "answer": 0}\n'
                       '{"id": "b", "question": "q", "choices": ["x"], "answer": 0}\n')
        argv = ["evaluate", "--model", toy.base_dir, "--probes", str(bad), "--out", str(tmp_path / "a.json")]
        expect = f"{bad}: line 2: field 'choices'"
    elif case == "bad-out":
        argv = ["evaluate", "--model", toy.base_dir, *probes, "--out", str(tmp_path / "a.txt")]
        expect = ".json or .npz"
    elif case == "out-is-a-file":
        (tmp_path / "file").write_text("x")
        argv = ["compare", "--base", toy.base_dir, "--model", toy.tuned_dir, *probes, "--out", str(tmp_path / "file")]
        expect = "not a directory"
    elif case == "other-options-snapshot":
        snapshot = tmp_path / "norm.json"
        evaluate(toy.base, toy.tokenizer, ProbeSet.from_jsonl(probe_file), normalize="chars",
                 show_progress=False).save(snapshot)
        argv = ["compare", "--base", str(snapshot), "--model", toy.tuned_dir, *probes]
        expect = "pass the same --normalize"
    elif case == "other-probes-snapshot":
        other = ProbeSet.from_records(toy.world.probe_records()[:5])
        snapshot = tmp_path / "other.json"
        evaluate(toy.base, toy.tokenizer, other, show_progress=False).save(snapshot)
        argv = ["compare", "--base", str(snapshot), "--model", toy.tuned_dir, *probes]
        expect = "different probe set"
    else:
        with pytest.raises(SystemExit) as exc:
            main(["evaluate", "--model", toy.base_dir, *probes, "--out", "a.json", "--batch-size", "0"])
        assert exc.value.code == 2
        assert "positive integer" in capsys.readouterr().err
        return
    code, out, err = run(capsys, *argv)
    assert code == 2
    assert expect in err and "Traceback" not in err
    assert err.startswith("forgetwatch: error:")


def test_installed_console_script(toy, probe_file, tmp_path):
    exe = shutil.which("forgetwatch")
    cmd = [exe] if exe else [sys.executable, "-m", "forgetwatch"]
    done = subprocess.run([*cmd, "compare", "--base", toy.base_dir, "--model", toy.tuned_dir,
                           "--probes", probe_file, "--no-progress"], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "overall" in done.stdout
    done = subprocess.run([*cmd, "evaluate", "--model", str(tmp_path / "missing"), "--probes", probe_file,
                           "--out", "x.json"], capture_output=True, text=True, timeout=300)
    assert done.returncode == 2 and "Traceback" not in done.stderr


def _copy_model(toy, tmp_path, name):
    path = tmp_path / name
    shutil.copytree(toy.base_dir, path)
    return path


def test_a_model_that_needs_its_own_code_is_refused_without_asking(toy, probe_file, tmp_path, capsys, monkeypatch):
    """An ``auto_map`` checkpoint: transformers would ask "run the custom code? [y/N]"; we never run it."""
    model = _copy_model(toy, tmp_path, "custom")
    marker = tmp_path / "custom-code-ran"
    config = json.loads((model / "config.json").read_text())
    config.update(model_type="fwcustom", auto_map={"AutoConfig": "configuration_fwcustom.FwConfig",
                                                   "AutoModelForCausalLM": "modeling_fwcustom.FwModel"})
    (model / "config.json").write_text(json.dumps(config))
    ran = f"open({str(marker)!r}, 'w').close()\n"
    (model / "configuration_fwcustom.py").write_text(
        ran + "from transformers import LlamaConfig\n\nclass FwConfig(LlamaConfig):\n    model_type = 'fwcustom'\n")
    (model / "modeling_fwcustom.py").write_text(
        ran + "from transformers import LlamaForCausalLM\n\nclass FwModel(LlamaForCausalLM):\n    pass\n")
    asked = []
    monkeypatch.setattr("builtins.input", lambda prompt="": asked.append(prompt) or "y")

    code, out, err = run(capsys, "evaluate", "--model", str(model), "--probes", probe_file,
                         "--out", str(tmp_path / "a.json"))
    assert code == 2
    assert not asked and not marker.exists()
    assert err.startswith("forgetwatch: error:") and err.count("\n") == 1
    assert "its own Python code" in err and "does not run" in err


def test_pickled_weights_that_hold_more_than_tensors_are_refused(toy, probe_file, tmp_path, capsys):
    import argparse

    import torch

    model = _copy_model(toy, tmp_path, "pickled")
    (model / "model.safetensors").unlink()
    state = {k: v.clone() for k, v in toy.base.state_dict().items()}
    state["extra"] = argparse.Namespace(note="not a tensor")  # torch.load(weights_only=True) refuses it
    torch.save(state, model / "pytorch_model.bin")

    code, out, err = run(capsys, "evaluate", "--model", str(model), "--probes", probe_file,
                         "--out", str(tmp_path / "a.json"))
    assert code == 2
    assert err.startswith("forgetwatch: error:") and err.count("\n") == 1
    assert "pickled weights" in err and "safetensors" in err


@pytest.mark.parametrize("device, expect", [("cuda", "CUDA is not available"), ("cuda:0", "CUDA is not available"),
                                            ("gpu", "not a device name")])
def test_a_device_this_machine_lacks_fails_before_anything_loads(tmp_path, capsys, monkeypatch, device, expect):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    # nothing else is checked first: the probes and the model do not even exist
    for argv in (["evaluate", "--model", str(tmp_path / "none"), "--out", str(tmp_path / "a.json")],
                 ["compare", "--base", str(tmp_path / "none"), "--model", str(tmp_path / "none")]):
        code, out, err = run(capsys, *argv, "--probes", str(tmp_path / "none.jsonl"), "--device", device)
        assert code == 2
        assert err.startswith(f"forgetwatch: error: --device {device}: {expect}") and err.count("\n") == 1


def test_batch_size_follows_the_projects_one_rule_and_usage_errors_are_one_line(capsys):
    from forgetwatch.options import batch_size_problem

    for value, parsed in (("0", 0), ("-3", -3), ("1.5", "1.5"), ("big", "big")):
        with pytest.raises(SystemExit) as exc:
            main(["evaluate", "--model", "m", "--probes", "p", "--out", "a.json", "--batch-size", value])
        assert exc.value.code == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and batch_size_problem(parsed) in err
        assert "forgetwatch evaluate --help" in err


def test_summary_is_strict_json_even_where_a_figure_does_not_apply(toy, tmp_path, capsys):
    generative = ProbeSet.from_records([r for r in toy.world.probe_records() if "choices" not in r][:6])
    probe_path = tmp_path / "gen.jsonl"
    generative.to_jsonl(probe_path)
    out = tmp_path / "out"
    code, _, err = run(capsys, "compare", "--base", toy.base_dir, "--model", toy.tuned_dir,
                       "--probes", str(probe_path), "--out", str(out))
    assert code == 0, err

    def refuse(name):
        raise AssertionError(f"{name} in summary.json")

    summary = json.loads((out / "summary.json").read_text(), parse_constant=refuse)
    assert summary["report"]["choice_kl"] is None  # no choices: the figure does not apply


def test_compare_on_behaviour_probes_shows_each_raw_response(toy, tmp_path, capsys):
    import csv

    probes = ProbeSet.from_records(toy.world.behaviour_probe_records(toy.world.known[:4]))
    path = tmp_path / "behaviour.jsonl"
    probes.to_jsonl(path)
    code, out, err = run(capsys, "compare", "--base", toy.base_dir, "--model", toy.tuned_dir, "--probes", str(path),
                         "--out", str(tmp_path / "out"))
    assert code == 0, err
    assert "refusals" in out and "brevity" in out
    tuned = Answers.load(tmp_path / "out" / "model_answers.json", probes=probes)
    assert tuned.predicted == tuned.outputs and all(isinstance(t, str) for t in tuned.predicted)
    with open(tmp_path / "out" / "samples.csv", newline="", encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    assert [r["predicted_after"] for r in rows] == tuned.predicted
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())["report"]
    assert summary["behaviour"]["words"] == pytest.approx(sum(len(t.split()) for t in tuned.outputs) / len(probes))
