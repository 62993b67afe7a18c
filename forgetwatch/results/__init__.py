"""What an evaluation gives: answers, transitions, trajectories, their files' formats."""
