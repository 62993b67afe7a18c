"""What a person reads: forgetwatch's lines and warnings each begin a line of their own, in a
terminal and in a log file, and its progress bar counts probes."""

from __future__ import annotations

import io
import re
import subprocess
import sys
import textwrap

import pytest
from tqdm import tqdm

from forgetwatch.common.console import say


def test_a_line_written_after_a_bar_fragment_begins_a_line_of_its_own():
    log = io.StringIO()  # not a terminal: a bar's updates pile up on one line there
    bar = tqdm(total=32, file=log, mininterval=0, desc="scoring")
    bar.update(31)
    say("[forgetwatch] stopping training at step 5", log)
    bar.close()
    lines = log.getvalue().split("\n")
    assert "[forgetwatch] stopping training at step 5" in lines
    assert "31/32" in lines[lines.index("[forgetwatch] stopping training at step 5") - 1]


def test_no_blank_line_without_a_bar():
    log = io.StringIO()
    say("one", log)
    say("two", log)
    assert log.getvalue() == "one\ntwo\n"


def _run(code: str, tmp_path) -> str:
    """``code`` run as a script with standard output and error into one log file (as ``2>&1``)."""
    log = tmp_path / "run.log"
    with open(log, "w") as f:
        done = subprocess.run(
            [sys.executable, "-c", textwrap.dedent(code)], stdout=f, stderr=subprocess.STDOUT, cwd=tmp_path
        )
    text = log.read_text()
    assert done.returncode == 0, text
    return text


@pytest.mark.slow
def test_warnings_begin_a_line_and_are_shown_once(tmp_path):
    text = _run(
        """
        import logging, sys
        from tqdm import tqdm
        import forgetwatch
        bar = tqdm(total=10, mininterval=0)
        bar.update(3)
        logging.getLogger("forgetwatch.scoring").warning("forgetwatch: a warning while a bar runs")
        bar.close()
        logging.getLogger("forgetwatch").info("not shown: below WARNING, like Python's own fallback")
        logging.basicConfig(format="APP %(message)s")  # the application's own logging: it shows them
        logging.getLogger("forgetwatch.scoring").warning("forgetwatch: shown by the application")
        """,
        tmp_path,
    )
    lines = text.split("\n")
    assert "forgetwatch: a warning while a bar runs" in lines
    assert "not shown" not in text
    assert text.count("shown by the application") == 1 and "APP forgetwatch: shown by the application" in lines


@pytest.mark.slow
def test_a_training_run_logged_to_a_file(toy, tmp_path):
    # a real Trainer with its progress bar, forgetwatch's base line, its own progress bar, the
    # evaluation lines and the stop line, all into one log file
    text = _run(
        f"""
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer, DataCollatorForLanguageModeling, Trainer, TrainingArguments
        from forgetwatch import ForgetWatchCallback
        from forgetwatch.toy import ToyWorld

        world = ToyWorld(seed=0)
        tokenizer = AutoTokenizer.from_pretrained({toy.base_dir!r})
        model = AutoModelForCausalLM.from_pretrained({toy.base_dir!r})
        data = [tokenizer(t) for t in world.distraction_texts(n=64)]
        callback = ForgetWatchCallback(world.probe_records(generative=False), eval_steps=2, max_forgetting=0.0, output_dir="fw")
        args = TrainingArguments("out", max_steps=4, learning_rate=5e-3, use_cpu=True, report_to=[],
                                 per_device_train_batch_size=8, save_strategy="no", logging_steps=100)
        Trainer(model=model, args=args, train_dataset=data, processing_class=tokenizer, callbacks=[callback],
                data_collator=DataCollatorForLanguageModeling(tokenizer, mlm=False)).train()
        """,
        tmp_path,
    )
    lines = text.split("\n")
    ours = [line for line in lines if "[forgetwatch]" in line]
    assert any(line.startswith("[forgetwatch] base:") for line in ours), text
    assert any(line.startswith("[forgetwatch] stopping training at step") for line in ours), text
    assert all(line.startswith("[forgetwatch]") for line in ours), ours
    # the bar counts probes: 96 of them, one total from start to end
    totals = {int(m) for m in re.findall(r"forgetwatch: scoring probes:[^\r\n]*?\d+/(\d+)", text)}
    assert totals == {96}, totals
    assert re.search(r"forgetwatch: scoring probes: 100%[^\r\n]*96/96[^\r\n]*\n", text)
