"""LLaMA-Factory launcher: ``forgetwatch llamafactory train.yaml [key=value ...]`` runs its training with
forgetwatch's callback added (it takes callbacks only from Python; docs/frameworks.md)."""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from pathlib import Path

from forgetwatch.common.console import say
from forgetwatch.common.problems import InputError
from forgetwatch.integrations.framework_settings import KEY_PREFIX, PATHS, FrameworkSettings, main_process


def run(config: str, overrides: Sequence[str] = ()) -> None:
    """Train as ``llamafactory-cli train CONFIG [key=value ...]`` does, watched by forgetwatch."""
    if not config.endswith((".yaml", ".yml", ".json")):  # else read_args passes the command line on as a list
        raise InputError([(config, None, None, "give LLaMA-Factory's training config as a .yaml, .yml or .json file")])
    if not Path(config).is_file():
        raise InputError([(config, None, None, "no such file")])
    try:
        from llamafactory.hparams.parser import read_args
        from llamafactory.train.tuner import run_exp
    except ImportError as err:
        raise ImportError(f"forgetwatch llamafactory needs LLaMA-Factory ({err}): pip install llamafactory") from err
    sys.argv = [sys.argv[0], config, *overrides]  # read_args reads the command line, as llamafactory-cli's does
    args = read_args()
    for key in {item.partition("=")[0] for item in overrides} & {KEY_PREFIX + name for name in PATHS}:
        if isinstance(args.get(key), str):  # a path typed on the command line: from the working directory
            args[key] = os.path.abspath(os.path.expanduser(args[key]))
    settings = FrameworkSettings.from_keys(args, config, config_file=config)
    if main_process():
        say(settings.describe("LLaMA-Factory"))
    theirs = {key: value for key, value in args.items() if not key.startswith(KEY_PREFIX)}
    run_exp(args=theirs, callbacks=[settings.callback()])
