"""Behaviour: whether a response still behaves (checks on behaviour probes), and how the
responses drift in length and style (figures logged at each evaluation)."""

from forgetwatch.behaviour.checks import CHECKS, check_problems, failed_checks
from forgetwatch.behaviour.style import looks_like_refusal

__all__ = ["CHECKS", "check_problems", "failed_checks", "looks_like_refusal"]
