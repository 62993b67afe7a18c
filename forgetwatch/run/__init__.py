"""A monitored run: the Watch, its schedule, stop rule, files and base snapshot."""
