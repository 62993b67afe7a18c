"""Axolotl plugin: ``plugins: [forgetwatch.integrations.axolotl.ForgetWatchPlugin]`` and ``forgetwatch_<key>``
settings in the Axolotl YAML (docs/frameworks.md)."""

from __future__ import annotations

from typing import Any

from axolotl.integrations.base import BasePlugin  # ImportError here: Axolotl is not installed
from pydantic import Field, create_model

try:
    from forgetwatch.common.console import say
    from forgetwatch.integrations.framework_settings import KEY_PREFIX, NAMES, FrameworkSettings, main_process
except ImportError as err:  # Axolotl would log an ImportError and train unwatched: stop the run instead
    raise RuntimeError(f"forgetwatch's Axolotl plugin cannot import forgetwatch: {err}") from err

#: the types Axolotl's own validation checks; forgetwatch checks every value again, by its rules
_TYPES: dict[str, Any] = {
    "probes": str | list[str] | dict[str, Any] | None,
    "eval_steps": int | None,
    "max_forgetting": float | None,
    "config": str | None,
    "replay": str | None,
}

#: forgetwatch's settings declared to Axolotl: one top-level ``forgetwatch_<key>`` each
ForgetWatchArgs = create_model(
    "ForgetWatchArgs",
    __doc__="forgetwatch's settings in an Axolotl YAML: forgetwatch_<key> for each forgetwatch setting.",
    **{KEY_PREFIX + name: (_TYPES.get(name, Any), Field(default=None)) for name in NAMES},
)


class ForgetWatchPlugin(BasePlugin):  # type: ignore[misc]
    """Adds a :class:`~forgetwatch.ForgetWatchCallback` to the trainer Axolotl builds (SFT and RL).

    The settings are checked and the probes loaded in :meth:`register`, when Axolotl reads its config, so a
    misspelled ``forgetwatch_`` key (which Axolotl would drop silently) or a bad probe file stops the run before any
    model loads; the callback joins in ``add_callbacks_post_trainer``, the one hook that gets the trainer.

    Example:
        >>> # axolotl.yaml: plugins: [forgetwatch.integrations.axolotl.ForgetWatchPlugin]
        >>> plugin = ForgetWatchPlugin()  # doctest: +SKIP
    """

    def __init__(self) -> None:
        super().__init__()
        self.settings: FrameworkSettings | None = None

    def get_input_args(self) -> str:
        return f"{__name__}.ForgetWatchArgs"

    def register(self, cfg: Any) -> None:
        path = cfg.get("axolotl_config_path")  # the YAML Axolotl read (by YAML 1.1): paths are from its folder
        self.settings = FrameworkSettings.from_keys(cfg, str(path or "Axolotl config"), config_file=path)
        if main_process():
            say(self.settings.describe("Axolotl"))

    def add_callbacks_post_trainer(self, cfg: Any, trainer: Any) -> list[Any]:
        settings = self.settings or FrameworkSettings.from_keys(cfg, "Axolotl config")  # register() not run
        return [settings.callback(trainer)]
