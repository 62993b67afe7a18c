"""Watch a chat model's tool use while it is fine-tuned on something else.

    python examples/tool_use_sft.py                 # offline toy world, CPU, about a minute
    python examples/tool_use_sft.py --max-steps 40 --eval-steps 10

A tiny chat model, taught to answer "What is the capital of X?" by calling a get_capital tool, is fine-tuned with
TRL's ``SFTTrainer`` on unrelated arithmetic while ``ForgetWatchCallback`` re-scores its tool-call probes: each
probe gives the conversation, the tools (JSON schemas, shown to the model by its chat template) and the expected call,
and the model's reply is right when the first call in it names that tool with those arguments. The script prints
the transition table and, for each probe forgotten, the call expected and the call made. For a real chat model,
``forgetwatch probes --starter tools`` writes 16 tool-call probes to start from.
"""

from __future__ import annotations

import argparse
from typing import Any

from common import HelpFormatter


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=HelpFormatter)
    parser.add_argument("--output-dir", default="out/tool_use", help="the trainer's output and forgetwatch/")
    parser.add_argument("--max-steps", type=int, default=30, help="fine-tuning steps on the arithmetic")
    parser.add_argument("--eval-steps", type=int, default=5, help="re-score the tool calls every N steps")
    return parser.parse_args(argv)


if __name__ == "__main__":
    parse_args()  # before the slow imports below: --help and mistakes answer at once

import datasets  # noqa: E402
from trl import SFTConfig, SFTTrainer  # noqa: E402

from forgetwatch import ForgetWatchCallback, Output, ProbeSet, Scoring  # noqa: E402
from forgetwatch.toy import ToyWorld  # noqa: E402

#: a call is short: the reply is cut here
REPLY_TOKENS = 32


class LastAnswers:
    """A sink keeping the last evaluation's answers: the calls the model made."""

    answers = None

    def on_evaluation(self, evaluation: Any) -> None:
        self.answers = evaluation.answers


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    world = ToyWorld()
    tokenizer, model = world.tool_use(taught=24)
    probes = ProbeSet.from_records(world.tool_probe_records(world.countries[:24]), source="toy tool calls")
    last = LastAnswers()
    scoring = Scoring(behaviour_max_new_tokens=REPLY_TOKENS)
    callback = ForgetWatchCallback(
        probes, eval_steps=args.eval_steps, scoring=scoring, output=Output(verbose=False), sinks=[last]
    )
    config = SFTConfig(
        args.output_dir,
        max_steps=args.max_steps,
        learning_rate=3e-3,
        per_device_train_batch_size=8,
        use_cpu=True,
        report_to=[],
        save_strategy="no",
        disable_tqdm=True,
        activation_checkpointing=False,
        dataloader_num_workers=0,
    )
    data = datasets.Dataset.from_dict({"text": world.distraction_texts()})
    trainer = SFTTrainer(model=model, args=config, train_dataset=data, processing_class=tokenizer, callbacks=[callback])
    trainer.train()
    step, report = callback.history[-1]
    print(f"tool calls at step {step}, against the model before fine-tuning:\n{report.summary()}")
    for i in [probes.ids.index(pid) for pid in report.forgotten_ids]:
        print(f"{probes[i].id}: expected {probes[i].answer_text}, made {last.answers.predicted[i] or 'no call'}")
    return {"callback": callback, "trainer": trainer, "probes": probes, "base": callback.base_answers}


if __name__ == "__main__":
    main()
