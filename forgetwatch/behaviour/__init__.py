"""Behaviour: whether a response still behaves (checks), and how the responses drift in length and style."""

from forgetwatch.behaviour.checks import CHECKS, check_problems, failed_checks
from forgetwatch.behaviour.style import looks_like_refusal

__all__ = ["CHECKS", "check_problems", "failed_checks", "looks_like_refusal"]
