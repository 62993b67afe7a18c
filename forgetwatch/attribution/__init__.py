"""Which training rows made a probe forget: each row's output-head gradient captured in the step that trains it,
ranked against a forgotten probe's (a plug-in beside the monitor; it never changes training)."""

from forgetwatch.attribution.gradients import HeadGradients
from forgetwatch.attribution.store import RowGradients

__all__ = ["HeadGradients", "RowGradients"]
