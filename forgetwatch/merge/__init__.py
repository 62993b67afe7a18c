"""Merging base and tuned weights to undo forgetting after training: a plug-in beside the monitor."""

from forgetwatch.merge.sweep import MergeSweep, merge_sweep

__all__ = ["MergeSweep", "merge_sweep"]
