"""Pictures of runs: the HTML page and the plots."""
