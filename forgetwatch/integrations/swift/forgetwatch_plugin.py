"""ms-swift's ``--external_plugins`` file: registers ``--callbacks forgetwatch``."""

from swift.callbacks import callbacks_map

from forgetwatch.common.console import say
from forgetwatch.integrations.framework_settings import FrameworkSettings, main_process

_settings = FrameworkSettings.from_environ()  # checked now, before ms-swift loads a model
if main_process():
    say(_settings.describe("ms-swift"))

# ms-swift calls each entry with (training arguments, trainer) while it builds the trainer
callbacks_map["forgetwatch"] = lambda args, trainer: _settings.callback(trainer)
