"""ms-swift plugin: forgetwatch in ``swift sft`` / ``swift rlhf`` with no code of the user's.

::

    FORGETWATCH_PROBES=probes.jsonl FORGETWATCH_EVAL_STEPS=50 \\
    swift sft ... --external_plugins "$(forgetwatch plugin-path swift)" --callbacks forgetwatch

ms-swift refuses flags it does not know, so the settings are ``FORGETWATCH_<KEY>`` environment
variables (see :mod:`forgetwatch.integrations.framework_settings`), which the ``ENV:`` block of
an ms-swift YAML sets too. ms-swift imports :data:`PLUGIN_FILE` by its path while it reads its
arguments, before it loads a model: the settings are checked and the probes loaded then.
Results go to ``<output_dir>/forgetwatch`` (ms-swift's versioned ``v<N>-<time>`` folder).

The file lives in a folder of its own because ms-swift puts the plugin's folder first on
``sys.path``, where a module named like another package would hide it.
"""

from __future__ import annotations

from pathlib import Path

#: the file to give ``--external_plugins``; ``forgetwatch plugin-path swift`` prints it
PLUGIN_FILE = Path(__file__).with_name("forgetwatch_plugin.py")
