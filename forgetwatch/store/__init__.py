"""A run's files: their names (here), every read (:mod:`~forgetwatch.store.read`) and every write
(:mod:`~forgetwatch.store.write`: :class:`~forgetwatch.store.write.RunStore`). They live in the run directory
only (a checkpoint keeps the watch's state, not a copy); writes made during training never raise."""

SNAPSHOT = "base_answers.npz"
HISTORY = "history.jsonl"  # one record per evaluation, each with its trajectory column; append-only
PROBES = "probes.jsonl"  # the questions, for reports
TRAIN_KL = "train_kl.npz"
LATEST = "answers_latest.npz"  # the last evaluation's answers, for the report
SUBDIR = "forgetwatch"  # inside the trainer's output directory
LOCK = "watch.lock"  # while a watch writes in the run directory: its pid and host
PREVIOUS = "previous"  # previous-<n>/: an earlier run's files, set aside by a fresh run (the newest: the largest n)
DAMAGED = f"{HISTORY}.damaged"  # a history with unreadable lines, moved here (numbered) before a resume rewrites it
SWEEP = "sweep.json"  # when training ended: the merge sweep's table (the report page shows it), and beside it
SWEEP_TABLE = "sweep.csv"  # ... the same as CSV
MERGED = "merged"  # ... and the model at the chosen alpha (a folder)
#: Every file the monitor itself writes (a repair method names its own; nothing else there is touched).
FILES = (SNAPSHOT, HISTORY, PROBES, TRAIN_KL, LATEST, SWEEP, SWEEP_TABLE, MERGED)
