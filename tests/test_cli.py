"""The command line on saved checkpoints: output, files, and clean errors."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest
import torch

from forgetwatch import Answers, ProbeSet, Scoring, compare, evaluate
from forgetwatch.cli import main


@pytest.fixture(scope="module")
def probe_file(toy, tmp_path_factory):
    path = tmp_path_factory.mktemp("cli") / "probes.jsonl"
    toy.probes.to_jsonl(path)
    return str(path)


@pytest.fixture(scope="module")
def few_probes(toy, tmp_path_factory):
    """A few multiple-choice probes: enough to tell where a model came from, quick to score."""
    path = tmp_path_factory.mktemp("cli") / "few.jsonl"
    ProbeSet.from_records([r for r in toy.world.probe_records() if "choices" in r][:4]).to_jsonl(path)
    return str(path)


def run(capsys, *argv):
    code = main([*argv, "--no-progress"])
    out, err = capsys.readouterr()
    return code, out, err


def test_compare_prints_the_table_and_writes_results(toy, probe_file, tmp_path, capsys):
    code, out, err = run(
        capsys,
        "compare",
        "--base",
        toy.base_dir,
        "--model",
        toy.tuned_dir,
        "--probes",
        probe_file,
        "--out",
        str(tmp_path),
        "--batch-size",
        "8",
    )
    assert code == 0, err
    for category in ("overall", "capitals", "colors", "rivers"):
        assert category in out
    names = {p.name for p in tmp_path.iterdir()}
    assert names == {"base_answers.json", "model_answers.json", "samples.csv", "transitions.csv", "summary.json"}

    # the same numbers as scoring the in-memory models directly
    probes = ProbeSet.from_jsonl(probe_file)
    expected = compare(
        evaluate(toy.base, toy.tokenizer, probes, show_progress=False),
        evaluate(toy.tuned, toy.tokenizer, probes, show_progress=False),
    )
    summary = json.loads((tmp_path / "summary.json").read_text())["report"]
    for key in ("n", "forgotten", "gained", "kept", "never", "forgotten_ids", "gained_ids"):
        assert summary[key] == getattr(expected, key), key
    assert expected.forgotten > 0  # the tuned model forgot something
    assert (
        Answers.load(tmp_path / "base_answers.json", probes=probes).correct.tolist()
        == evaluate(toy.base, toy.tokenizer, probes, show_progress=False).correct.tolist()
    )
    lines = (tmp_path / "samples.csv").read_text().splitlines()
    assert len(lines) == len(probes) + 1
    # the questions and raw outputs beside each sample, numbers rounded (no 0.24000000000000002)
    import csv

    with open(tmp_path / "samples.csv", newline="", encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    tuned = Answers.load(tmp_path / "model_answers.json", probes=probes)
    assert [r["question"] for r in rows] == [p.question for p in probes]
    assert [r["answer"] for r in rows] == [p.answer_text for p in probes]
    # a multiple-choice prediction is the chosen choice's text; its index has a column of its own
    chosen = [(r, p.choices, tuned.predicted[i]) for i, (r, p) in enumerate(zip(rows, probes)) if p.choices]
    assert chosen and any(index != 0 for _, _, index in chosen)
    assert all(
        r["predicted_after"] == choices[index] and r["choice_index_after"] == str(index) for r, choices, index in chosen
    )
    assert {r["choice_index_after"] for r, p in zip(rows, probes) if not p.choices} == {""}
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


@pytest.mark.parametrize(
    "case",
    [
        "missing-model",
        "not-a-model-dir",
        "missing-probes",
        "bad-probes",
        "bad-out",
        "out-is-a-file",
        "other-probes-snapshot",
        "other-options-snapshot",
        "bad-batch-size",
    ],
)
def test_errors_are_one_clear_line_with_exit_code_2(toy, probe_file, tmp_path, capsys, case):
    probes = ["--probes", probe_file]
    if case == "missing-model":
        argv = ["compare", "--base", str(tmp_path / "nope"), "--model", toy.tuned_dir, *probes]
        expect = "no such directory"
    elif case == "not-a-model-dir":
        argv = ["evaluate", "--model", str(tmp_path), *probes, "--out", str(tmp_path / "a.json")]
        expect = "no config.json"
    elif case == "missing-probes":
        argv = [
            "evaluate",
            "--model",
            toy.base_dir,
            "--probes",
            str(tmp_path / "none.jsonl"),
            "--out",
            str(tmp_path / "a.json"),
        ]
        expect = "no such file"
    elif case == "bad-probes":
        bad = tmp_path / "bad.jsonl"
        bad.write_text(
            '{"id": "a", "question": "q", "choices": ["x", "y"], "answer": 0}\n'
            '{"id": "b", "question": "q", "choices": ["x"], "answer": 0}\n'
        )
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
        evaluate(
            toy.base,
            toy.tokenizer,
            ProbeSet.from_jsonl(probe_file),
            scoring=Scoring(normalize="chars"),
            show_progress=False,
        ).save(snapshot)
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


@pytest.mark.slow
def test_installed_console_script(toy, probe_file, tmp_path):
    exe = shutil.which("forgetwatch")
    cmd = [exe] if exe else [sys.executable, "-m", "forgetwatch"]
    done = subprocess.run(
        [*cmd, "compare", "--base", toy.base_dir, "--model", toy.tuned_dir, "--probes", probe_file, "--no-progress"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    assert "overall" in done.stdout
    done = subprocess.run(
        [*cmd, "evaluate", "--model", str(tmp_path / "missing"), "--probes", probe_file, "--out", "x.json"],
        capture_output=True,
        text=True,
        timeout=300,
    )
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
    config.update(
        model_type="fwcustom",
        auto_map={"AutoConfig": "configuration_fwcustom.FwConfig", "AutoModelForCausalLM": "modeling_fwcustom.FwModel"},
    )
    (model / "config.json").write_text(json.dumps(config))
    ran = f"open({str(marker)!r}, 'w').close()\n"
    (model / "configuration_fwcustom.py").write_text(
        ran + "from transformers import LlamaConfig\n\nclass FwConfig(LlamaConfig):\n    model_type = 'fwcustom'\n"
    )
    (model / "modeling_fwcustom.py").write_text(
        ran + "from transformers import LlamaForCausalLM\n\nclass FwModel(LlamaForCausalLM):\n    pass\n"
    )
    asked = []
    monkeypatch.setattr("builtins.input", lambda prompt="": asked.append(prompt) or "y")

    code, out, err = run(
        capsys, "evaluate", "--model", str(model), "--probes", probe_file, "--out", str(tmp_path / "a.json")
    )
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

    code, out, err = run(
        capsys, "evaluate", "--model", str(model), "--probes", probe_file, "--out", str(tmp_path / "a.json")
    )
    assert code == 2
    assert err.startswith("forgetwatch: error:") and err.count("\n") == 1
    assert "pickled weights" in err and "safetensors" in err


@pytest.mark.parametrize(
    "device, expect",
    [("cuda", "CUDA is not available"), ("cuda:0", "CUDA is not available"), ("gpu", "not a device name")],
)
def test_a_device_this_machine_lacks_fails_before_anything_loads(tmp_path, capsys, monkeypatch, device, expect):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    # nothing else is checked first: the probes and the model do not even exist
    for argv in (
        ["evaluate", "--model", str(tmp_path / "none"), "--out", str(tmp_path / "a.json")],
        ["compare", "--base", str(tmp_path / "none"), "--model", str(tmp_path / "none")],
    ):
        code, out, err = run(capsys, *argv, "--probes", str(tmp_path / "none.jsonl"), "--device", device)
        assert code == 2
        assert err.startswith(f"forgetwatch: error: --device {device}: {expect}") and err.count("\n") == 1


def test_batch_size_follows_the_projects_one_rule_and_usage_errors_are_one_line(capsys):
    for value in ("0", "-3", "1.5", "big", "true"):  # read as YAML reads them
        with pytest.raises(SystemExit) as exc:
            main(["evaluate", "--model", "m", "--probes", "p", "--out", "a.json", "--batch-size", value])
        assert exc.value.code == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "argument --batch-size" in err and "forgetwatch evaluate --help" in err


def test_summary_is_strict_json_even_where_a_figure_does_not_apply(toy, tmp_path, capsys):
    generative = ProbeSet.from_records([r for r in toy.world.probe_records() if "choices" not in r][:6])
    probe_path = tmp_path / "gen.jsonl"
    generative.to_jsonl(probe_path)
    out = tmp_path / "out"
    code, _, err = run(
        capsys,
        "compare",
        "--base",
        toy.base_dir,
        "--model",
        toy.tuned_dir,
        "--probes",
        str(probe_path),
        "--out",
        str(out),
    )
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
    code, out, err = run(
        capsys,
        "compare",
        "--base",
        toy.base_dir,
        "--model",
        toy.tuned_dir,
        "--probes",
        str(path),
        "--out",
        str(tmp_path / "out"),
    )
    assert code == 0, err
    assert "refusals" in out and "brevity" in out
    tuned = Answers.load(tmp_path / "out" / "model_answers.json", probes=probes)
    assert tuned.predicted == tuned.outputs and all(isinstance(t, str) for t in tuned.predicted)
    with open(tmp_path / "out" / "samples.csv", newline="", encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    assert [r["predicted_after"] for r in rows] == tuned.predicted
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())["report"]
    assert summary["behaviour"]["words"] == pytest.approx(sum(len(t.split()) for t in tuned.outputs) / len(probes))


# -- checkpoints: every path and hub id checked before any model loads ------------------------------


@pytest.fixture
def hub_cache(tmp_path, monkeypatch):
    """An empty local hub cache of this test's own."""
    from huggingface_hub import constants

    cache = tmp_path / "hub-cache"
    cache.mkdir()
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
    return cache


def _put_in_hub_cache(cache, repo, model_dir):
    """``model_dir`` as the hub cache holds a downloaded ``repo`` at its main branch."""
    sha = "0123456789abcdef0123456789abcdef01234567"
    folder = cache / f"models--{repo.replace('/', '--')}"
    (folder / "refs").mkdir(parents=True)
    (folder / "refs" / "main").write_text(sha)
    shutil.copytree(model_dir, folder / "snapshots" / sha)


def _one_line_error(code, err, expect):
    assert code == 2, err
    assert err.startswith("forgetwatch: error:") and err.count("\n") == 1, err
    assert expect in err, err


@pytest.mark.parametrize(
    "flag, value",
    [
        ("--model", "runs/finall"),  # looks like a hub id, but runs/ is a local directory
        ("--model", "runs/a/b"),
        ("--model", "./finall"),
        ("--model", "~/no-such-forgetwatch-dir"),
        ("--base", "runs/finall"),
        ("--tokenizer", "runs/tok"),
    ],
)
def test_a_mistyped_path_is_one_line_before_anything_loads(
    toy, probe_file, tmp_path, capsys, monkeypatch, no_model_loads, hub_cache, flag, value
):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "runs").mkdir()
    args = {"--base": toy.base_dir, "--model": toy.tuned_dir, flag: value}
    argv = ["compare", *(x for kv in args.items() for x in kv), "--probes", probe_file]
    code, _, err = run(capsys, *argv)
    _one_line_error(code, err, f"{flag}: no such directory: {value}")


def test_offline_a_hub_id_that_is_not_cached_is_one_line(
    toy, probe_file, capsys, monkeypatch, no_model_loads, hub_cache
):
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    code, _, err = run(capsys, "compare", "--base", toy.base_dir, "--model", "fworg/finall", "--probes", probe_file)
    _one_line_error(code, err, "--model fworg/finall: no such directory, and HF_HUB_OFFLINE is set")
    assert "not in the local hub cache" in err


def test_offline_a_cached_hub_id_is_scored_from_the_cache(toy, few_probes, tmp_path, capsys, monkeypatch, hub_cache):
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    _put_in_hub_cache(hub_cache, "fworg/tuned", toy.tuned_dir)
    for model, out in (("fworg/tuned", "hub.json"), (toy.tuned_dir, "local.json")):
        code, _, err = run(capsys, "evaluate", "--model", model, "--probes", few_probes, "--out", str(tmp_path / out))
        assert code == 0, err
    hub, local = (Answers.load(tmp_path / out) for out in ("hub.json", "local.json"))
    assert hub.model == "fworg/tuned"
    assert hub.predicted == local.predicted and hub.choice_logprobs[0].tolist() == local.choice_logprobs[0].tolist()


@pytest.fixture
def fake_hub(monkeypatch, tmp_path):
    """A hub endpoint on this machine answering every request about a model with one status:
    counts those requests. (huggingface_hub's own list of coding agents, fetched once a day for
    its user-agent header, is served apart: a 503 there makes huggingface_hub retry for 20 s.)"""
    import http.server
    import threading

    from huggingface_hub import constants
    from huggingface_hub.utils import close_session

    class Hub(http.server.BaseHTTPRequestHandler):
        status, error_code, requests = 404, "RepoNotFound", []

        def do_GET(self):
            if self.path == "/api/agent-harnesses":
                body = b'{"standardEnvVars": [], "harnesses": {}}'
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)
                return
            Hub.requests.append(self.path)
            self.send_response(Hub.status)
            self.send_header("X-Error-Code", Hub.error_code)
            self.send_header("Content-Length", "0")
            self.end_headers()

        do_HEAD = do_GET

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Hub)
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True).start()
    monkeypatch.setenv("NO_PROXY", "127.0.0.1")
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(constants, "ENDPOINT", f"http://127.0.0.1:{server.server_port}")
    # file downloads too (their address is made once, at import): every request comes here, to be counted
    monkeypatch.setattr(
        constants, "HUGGINGFACE_CO_URL_TEMPLATE", constants.ENDPOINT + "/{repo_id}/resolve/{revision}/{filename}"
    )
    monkeypatch.setattr(constants, "AGENT_HARNESSES_PATH", str(tmp_path / "agent_harnesses.json"))  # not the user's
    close_session()  # a client made before would not see NO_PROXY
    yield Hub
    server.shutdown()
    server.server_close()
    close_session()


def test_online_a_hub_id_the_hub_does_not_have_is_asked_once(
    toy, probe_file, capsys, no_model_loads, hub_cache, fake_hub
):
    code, _, err = run(capsys, "compare", "--base", toy.base_dir, "--model", "fworg/finall", "--probes", probe_file)
    _one_line_error(code, err, "--model fworg/finall: no such directory, nor a model on the hub")
    assert len(fake_hub.requests) == 1


def test_online_an_unreachable_hub_is_asked_once(toy, probe_file, capsys, no_model_loads, hub_cache, fake_hub):
    fake_hub.status, fake_hub.error_code = 503, ""
    code, _, err = run(capsys, "compare", "--base", toy.base_dir, "--model", "fworg/tuned", "--probes", probe_file)
    _one_line_error(code, err, "--model fworg/tuned: no such directory, and the hub cannot be reached")
    assert len(fake_hub.requests) == 1  # no retries


def test_online_an_unreachable_hub_leaves_the_cached_copy_to_use(
    toy, few_probes, tmp_path, capsys, hub_cache, fake_hub
):
    fake_hub.status, fake_hub.error_code = 503, ""
    _put_in_hub_cache(hub_cache, "fworg/tuned", toy.tuned_dir)
    code, _, err = run(
        capsys, "evaluate", "--model", "fworg/tuned", "--probes", few_probes, "--out", str(tmp_path / "a.json")
    )
    assert code == 0, err
    assert "--model fworg/tuned: the hub cannot be reached" in err and "using the cached copy" in err
    assert len(fake_hub.requests) == 1  # asked once; the model and tokenizer then come from the cache alone


def test_a_cut_weights_file_is_one_line_naming_it(toy, probe_file, tmp_path, capsys, no_model_loads):
    model = _copy_model(toy, tmp_path, "cut")
    weights = model / "model.safetensors"
    with open(weights, "r+b") as f:
        f.truncate(weights.stat().st_size // 2)
    code, _, err = run(capsys, "compare", "--base", toy.base_dir, "--model", str(model), "--probes", probe_file)
    _one_line_error(code, err, f"{weights}: not a whole safetensors file (incomplete metadata, file not fully covered)")


def test_a_missing_shard_is_one_line_naming_it(toy, probe_file, tmp_path, capsys, no_model_loads):
    model = tmp_path / "sharded"
    toy.tuned.save_pretrained(model, max_shard_size="200KB")
    toy.tokenizer.save_pretrained(model)
    shards = sorted(model.glob("model-*.safetensors"))
    assert len(shards) > 2
    shards[1].unlink()
    capsys.readouterr()  # what saving printed
    code, _, err = run(capsys, "compare", "--base", toy.base_dir, "--model", str(model), "--probes", probe_file)
    _one_line_error(
        code,
        err,
        f"{model / 'model.safetensors.index.json'}: lists weight files that are not in {model}: {shards[1].name}",
    )


@pytest.mark.parametrize("where", ["config.json", "tokenizer_config.json"])
def test_a_checkpoint_with_its_own_code_for_a_known_architecture_is_refused(
    toy, probe_file, tmp_path, capsys, no_model_loads, where
):
    """``auto_map`` beside a ``model_type`` transformers knows: transformers would load its own
    class instead and say nothing; forgetwatch says so and stops."""
    model = _copy_model(toy, tmp_path, "mapped")
    doc = json.loads((model / where).read_text())
    doc["auto_map"] = (
        {"AutoConfig": "configuration_x.XConfig", "AutoModelForCausalLM": "modeling_x.XForCausalLM"}
        if where == "config.json"
        else {"AutoTokenizer": ["tokenization_x.XTokenizer", None]}
    )
    (model / where).write_text(json.dumps(doc))
    code, _, err = run(capsys, "compare", "--base", toy.base_dir, "--model", str(model), "--probes", probe_file)
    _one_line_error(code, err, f"--model {model}: it needs its own Python code (auto_map in {where}: ")
    assert "which forgetwatch does not run" in err


def _rewrite_weights(model_dir, change):
    from safetensors.torch import load_file, save_file

    path = model_dir / "model.safetensors"
    tensors = load_file(path)
    change(tensors)
    save_file(tensors, path, metadata={"format": "pt"})


def test_a_checkpoint_missing_tensors_is_refused_naming_them(toy, probe_file, tmp_path, capsys):
    model = _copy_model(toy, tmp_path, "partial")
    layer = "model.layers.1."

    def drop_a_layer(tensors):
        for name in [n for n in tensors if n.startswith(layer)]:
            del tensors[name]

    _rewrite_weights(model, drop_a_layer)
    dropped = sorted(n for n in toy.base.state_dict() if n.startswith(layer))
    code, _, err = run(
        capsys, "evaluate", "--model", str(model), "--probes", probe_file, "--out", str(tmp_path / "a.json")
    )
    assert code == 2 and "Traceback" not in err and "LOAD REPORT" not in err
    line = err.splitlines()[-1]  # after transformers' progress bar, if any
    assert line.startswith(
        f"forgetwatch: error: --model {model}: the checkpoint lacks {len(dropped)} tensor(s) "
        f"the model needs: {', '.join(dropped[:3])} and {len(dropped) - 3} more"
    )
    assert "randomly initialised" in line
    assert not (tmp_path / "a.json").exists()


def test_a_tensor_of_another_shape_is_refused_naming_it(toy, probe_file, tmp_path, capsys):
    model = _copy_model(toy, tmp_path, "reshaped")
    _rewrite_weights(model, lambda t: t.update({"model.norm.weight": t["model.norm.weight"][:-1].clone()}))
    code, _, err = run(
        capsys, "evaluate", "--model", str(model), "--probes", probe_file, "--out", str(tmp_path / "a.json")
    )
    assert code == 2 and "Traceback" not in err
    width = toy.base.config.hidden_size
    assert err.splitlines()[-1].startswith(
        f"forgetwatch: error: --model {model}: the checkpoint holds 1 tensor(s) of another shape than its config "
        f"says: model.norm.weight ({width - 1} saved, {width} in the config)"
    )


def test_a_tied_head_the_checkpoint_rightly_leaves_out_still_loads(toy, few_probes, tmp_path, capsys):
    import copy

    config = copy.deepcopy(toy.base.config)
    config.tie_word_embeddings = True
    tied = type(toy.base)(config)
    model = tmp_path / "tied"
    tied.save_pretrained(model)
    toy.tokenizer.save_pretrained(model)
    from safetensors import safe_open

    with safe_open(str(model / "model.safetensors"), framework="pt") as f:
        assert "lm_head.weight" not in set(f.keys())  # the head is the embedding: not saved twice
    code, _, err = run(
        capsys, "evaluate", "--model", str(model), "--probes", few_probes, "--out", str(tmp_path / "a.json")
    )
    assert code == 0, err


def test_probes_without_out_writes_the_set_to_stdout(capsys, tmp_path):
    from forgetwatch.starters import starter_path

    assert main(["probes", "--starter", "knowledge"]) == 0
    out, err = capsys.readouterr()
    assert out == starter_path("knowledge").read_text(encoding="utf-8")  # nothing else: it pipes
    assert "smoke alarm" in err
    (tmp_path / "piped.jsonl").write_text(out, encoding="utf-8")
    assert len(ProbeSet.from_jsonl(tmp_path / "piped.jsonl")) == 40


def test_a_checkpoint_with_nan_weights_is_one_error_naming_it_before_anything_is_written(
    toy, few_probes, tmp_path, capsys, caplog
):
    from transformers import AutoModelForCausalLM

    broken = _copy_model(toy, tmp_path, "nan")
    model = AutoModelForCausalLM.from_pretrained(broken)
    with torch.no_grad():
        model.get_input_embeddings().weight[5:].fill_(float("nan"))  # most tokens' embeddings
    model.save_pretrained(broken)
    out = tmp_path / "out"
    code, printed, err = run(
        capsys, "compare", "--base", toy.base_dir, "--model", str(broken), "--probes", few_probes, "--out", str(out)
    )
    assert code == 2 and "Traceback" not in err, err
    [line] = [line for line in err.splitlines() if "forgetwatch" in line]
    assert "packed scores differ" not in caplog.text  # NaN says nothing of packing
    assert line.startswith(f"forgetwatch: error: {broken}: its log-probabilities are not finite numbers (NaN or inf)")
    assert "its weights or its outputs hold NaN or inf" in line
    assert "forgotten" not in printed and not (out.exists() and any(out.iterdir()))  # no report, no files
    code, _, err = run(capsys, "evaluate", "--model", str(broken), "--probes", few_probes, "--out", str(out / "a.json"))
    assert code == 2 and "not finite" in err and not (out / "a.json").exists()
