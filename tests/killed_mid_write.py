"""Run by tests/test_callback.py: a training run that stops in the middle of a forgetwatch write
after its checkpoint at step 10 and waits there to be killed (kill -9).

``python killed_mid_write.py MODEL_DIR DATA_DIR PROBES OUT``: trains the model saved in
MODEL_DIR (with its tokenizer) on the dataset saved in DATA_DIR, output in OUT, evaluating
every 5 steps and saving at step 10. The write of step 15's ``answers_latest.npz`` pauses
half written (its temporary file open, nothing renamed), after step 15's history record;
then ``OUT/paused`` appears, and the process waits for its end.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
import types
from pathlib import Path

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch
from datasets import load_from_disk
from trainers import make_trainer  # tests/, this script's folder
from transformers import AutoModelForCausalLM, AutoTokenizer

from forgetwatch import Output, ProbeSet
from forgetwatch.integrations.callback import ForgetWatchCallback
from forgetwatch.results import answers as store
from forgetwatch.store import HISTORY, LATEST


def pause_in_step_15s_answers(out: Path) -> None:
    real = store.atomic_write

    @contextlib.contextmanager
    def paused(path, mode="w"):
        with real(path, mode) as f:
            yield f
            history = Path(path).parent / HISTORY
            if Path(path).name == LATEST and history.read_text().count("\n") == 3:
                f.flush()
                (out / "paused").touch()
                threading.Event().wait()  # until killed

    store.atomic_write = paused


def main(model_dir: str, data_dir: str, probes: str, out: str) -> None:
    torch.set_num_threads(1)
    pause_in_step_15s_answers(Path(out))
    toy = types.SimpleNamespace(
        base=AutoModelForCausalLM.from_pretrained(model_dir), tokenizer=AutoTokenizer.from_pretrained(model_dir)
    )
    callback = ForgetWatchCallback(ProbeSet.from_jsonl(probes), eval_steps=5, output=Output(verbose=False))
    make_trainer(
        toy, load_from_disk(data_dir), Path(out), [callback], max_steps=20, save_strategy="steps", save_steps=10
    ).train()
    sys.exit("the write at step 15 never paused")


if __name__ == "__main__":
    main(*sys.argv[1:])
