"""Progress bars, forgetwatch's lines and warnings, each on a line of its own in a terminal and in a log file."""

from __future__ import annotations

import logging
import sys
from typing import IO

from tqdm import tqdm as _std_tqdm
from tqdm.auto import tqdm


def _is_terminal(stream: IO[str] | None) -> bool:
    isatty = getattr(stream, "isatty", None)
    try:
        return bool(isatty and isatty())
    except ValueError:  # a closed stream
        return False


def progress_bar(total: int, desc: str, show: bool = True) -> tqdm:
    """A bar counting ``total`` probes, cleared when done in a terminal, ending its line in a log file."""
    terminal = _is_terminal(sys.stderr)
    if show and not terminal and _bar_open_on(sys.stderr):
        sys.stderr.write("\n")  # not after another bar's last update, in a log file
    return tqdm(total=total, desc=desc, unit="probe", disable=not show, leave=not terminal)


def _bar_open_on(stream: IO[str]) -> bool:
    # standard output and error count as one
    console = (sys.stdout, sys.stderr)
    bars = set(getattr(_std_tqdm, "_instances", ())) | set(getattr(tqdm, "_instances", ()))
    return any(
        not getattr(bar, "disable", True)
        and hasattr(bar, "last_print_t")
        and (bar.fp == stream or (stream in console and any(bar.fp == s for s in console)))
        for bar in bars
    )


def say(line: str, stream: IO[str] | None = None) -> None:
    """Write ``line`` on a line of its own, above the bars in a terminal, after them in a log file."""
    stream = sys.stdout if stream is None else stream
    if _is_terminal(stream):
        tqdm.write(line, file=stream)
        return
    stream.write(("\n" if _bar_open_on(stream) else "") + line + "\n")
    stream.flush()


class ConsoleHandler(logging.Handler):
    """Shows ``forgetwatch`` warnings on standard error when no handler of the application would."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.setFormatter(logging.Formatter("%(message)s"))

    def emit(self, record: logging.LogRecord) -> None:
        if _handled_elsewhere(logging.getLogger(record.name)):
            return
        try:
            say(self.format(record), sys.stderr)
        except Exception:  # noqa: BLE001 - a warning that cannot be shown must not end anything
            self.handleError(record)


def _handled_elsewhere(logger: logging.Logger) -> bool:
    # Python's last-resort rule
    current: logging.Logger | None = logger
    while current is not None:
        if any(not isinstance(h, ConsoleHandler) for h in current.handlers):
            return True
        if not current.propagate:
            return False
        current = current.parent
    return False
