"""Merging base and tuned weights to undo forgetting after training: a plug-in beside the monitor."""

from forgetwatch.merge.at_end import MergeAtEnd
from forgetwatch.merge.sweep import MergeSweep, merge_sweep

__all__ = ["MergeAtEnd", "MergeSweep", "merge_sweep"]
