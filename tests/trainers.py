"""A transformers Trainer on the toy world for the callback's tests (the data: conftest's
``train_data`` fixture), and a simulated crash."""

from __future__ import annotations

import copy

from transformers import DataCollatorForLanguageModeling, Trainer, TrainerCallback, TrainingArguments

#: a trainer on the CPU in float32 that saves and reports nothing, quietly (TRL turns bf16 on by default, even there)
CPU_QUIET = dict(use_cpu=True, bf16=False, report_to=[], save_strategy="no", disable_tqdm=True)


def make_trainer(toy, train_data, tmp_path, callbacks, model=None, **overrides):
    settings = dict(
        max_steps=30,
        per_device_train_batch_size=16,
        learning_rate=3e-3,
        logging_steps=5,
        report_to=[],
        save_strategy="no",
        use_cpu=True,
        seed=0,
        disable_tqdm=True,
    )
    settings.update(overrides)
    return Trainer(
        model=model if model is not None else copy.deepcopy(toy.base),
        args=TrainingArguments(str(tmp_path), **settings),
        train_dataset=train_data,
        eval_dataset=train_data.select(range(32)),
        data_collator=DataCollatorForLanguageModeling(toy.tokenizer, mlm=False),
        processing_class=toy.tokenizer,
        callbacks=callbacks,
    )


class KillAt(TrainerCallback):
    """Simulates a crash: raises once training reaches ``step``."""

    def __init__(self, step):
        self.step = step

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step == self.step:
            raise RuntimeError("killed")


def killed_and_resumed(
    toy, train_data, run, callback_settings, *, kill_at, resume_from, before_resume=None, **trainer_settings
):
    """A run killed at step ``kill_at``, then resumed from its ``checkpoint-<resume_from>``
    with a fresh callback (``before_resume()`` called first): ``(callback, trainer)`` of the
    resumed run."""
    from forgetwatch.integrations.callback import ForgetWatchCallback

    try:
        make_trainer(
            toy,
            train_data,
            run,
            [ForgetWatchCallback(toy.probes, **copy.deepcopy(callback_settings)), KillAt(kill_at)],
            **trainer_settings,
        ).train()
    except RuntimeError as err:
        assert "killed" in str(err)
    else:
        raise AssertionError(f"the run was not killed at step {kill_at}")
    if before_resume is not None:
        before_resume()
    callback = ForgetWatchCallback(toy.probes, **copy.deepcopy(callback_settings))  # a Replay is one run's
    trainer = make_trainer(toy, train_data, run, [callback], **trainer_settings)
    trainer.train(resume_from_checkpoint=str(run / f"checkpoint-{resume_from}"))
    return callback, trainer


def run_view(tokenizer, **fields):
    """A run in one process as a plug-in sees it when training begins (its scorer: of one probe, batches of 8)."""
    from forgetwatch import ProbeSet, Scorer
    from forgetwatch.common.distributed import Ranks
    from forgetwatch.run.plugins import RunView

    probe = ProbeSet.from_records([{"id": "p", "question": "Say hi:", "check": {"max_words": 5}}])
    return RunView(**{"ranks": Ranks(), "scorer": Scorer(tokenizer, probe), **fields})
