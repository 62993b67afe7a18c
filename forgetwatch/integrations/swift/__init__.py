"""ms-swift plugin: ``FORGETWATCH_<KEY>`` variables and ``swift sft ... --external_plugins "$(forgetwatch plugin-path
swift)" --callbacks forgetwatch`` (docs/frameworks.md). Its own folder: ms-swift puts it first on ``sys.path``."""

from __future__ import annotations

from pathlib import Path

#: the file to give ``--external_plugins``; ``forgetwatch plugin-path swift`` prints it
PLUGIN_FILE = Path(__file__).with_name("forgetwatch_plugin.py")
