"""Where evaluation results go: metric keys, the trainer's reporting integrations, the console.

forgetwatch does not call ``Trainer.log``: TRL trainers override it to average and clear their
own metric buffers (loss, entropy, rewards), so an extra call from a callback would take those
values away from the trainer's next log line. Instead the metrics are appended to
``state.log_history`` and handed to every other callback's ``on_log`` directly, as
``Trainer.log`` would, at the global step they were measured.
"""

from __future__ import annotations

import math
from typing import Any

from .report import TransitionReport

PREFIX = "forgetwatch/"
EVAL_PREFIX = "eval_forgetwatch_"

#: logged name -> TransitionReport attribute (contract names first, then drift warnings)
METRICS = {
    "forgetting": "forgetting",
    "backward_transfer": "backward_transfer",
    "forgetting_adjusted": "forgetting_adjusted",
    "backward_transfer_adjusted": "backward_transfer_adjusted",
    "forgotten": "forgotten",
    "gained": "gained",
    "accuracy": "accuracy_after",
    "accuracy_base": "accuracy_before",
    "logprob_drop": "logprob_drop",
    "choice_kl": "choice_kl",
}

# callbacks that print every log dict to the console: the one-line summary replaces them
CONSOLE_CALLBACKS = frozenset({"ProgressCallback", "PrinterCallback", "NotebookProgressCallback",
                               "RichProgressCallback"})


def metric_values(report: TransitionReport, categories: bool = True) -> dict[str, float]:
    """``forgetwatch/<name>`` for the overall report and ``forgetwatch/<category>/<name>``.

    Example:
        >>> metric_values(TransitionReport(n=2, forgotten=1), categories=False)["forgetwatch/forgotten"]
        1.0
    """
    out = {f"{PREFIX}{name}": float(getattr(report, attr)) for name, attr in METRICS.items()}
    if categories:
        for cat, child in report.by_category.items():
            out.update({f"{PREFIX}{cat}/{name}": float(getattr(child, attr)) for name, attr in METRICS.items()})
    return out


def eval_metric_values(report: TransitionReport) -> dict[str, float]:
    """Overall figures as trainer evaluation metrics (``eval_forgetwatch_forgetting``, ...),
    so ``metric_for_best_model="forgetwatch_forgetting"`` can select checkpoints on them."""
    return {f"{EVAL_PREFIX}{name}": float(getattr(report, attr)) for name, attr in METRICS.items()}


def _prints_logs(callback: Any) -> bool:
    return any(cls.__name__ in CONSOLE_CALLBACKS for cls in type(callback).__mro__)


def console_line(step: int, report: TransitionReport) -> str:
    """One short line per evaluation."""
    return (f"[forgetwatch] step {step}: forgetting {_pct(report.forgetting)} "
            f"(adjusted {_pct(report.forgetting_adjusted)}), backward transfer "
            f"{_pct(report.backward_transfer)}, accuracy {_pct(report.accuracy_after)} "
            f"(base {_pct(report.accuracy_before)}); {report.forgotten} forgotten, "
            f"{report.gained} gained of {report.n}")


def _pct(x: float) -> str:
    return "n/a" if math.isnan(x) else f"{100 * x:.1f}%"


def emit(handler: Any, metrics: dict[str, float], args: Any, state: Any, control: Any,
         source: Any = None) -> None:
    """Log ``metrics`` at ``state.global_step``: into ``state.log_history`` and to every
    callback's ``on_log`` except console printers and ``source`` (the caller itself).

    ``control.should_log`` is left alone (``CallbackHandler.on_log`` would reset it, which
    would cancel the trainer's own log line at this step).
    """
    entry = dict(metrics)
    if state.epoch is not None:
        entry["epoch"] = state.epoch
    state.log_history.append({**entry, "step": state.global_step})  # as Trainer.log writes it
    if handler is None:
        return
    listeners = [cb for cb in handler.callbacks if cb is not source and not _prints_logs(cb)]
    everyone = handler.callbacks
    handler.callbacks = listeners  # dispatch through the handler: same arguments as Trainer.log
    try:
        handler.call_event("on_log", args, state, control, logs=dict(metrics))
    finally:
        handler.callbacks = everyone
