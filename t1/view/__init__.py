"""`t1 view`: a read-only local web viewer of a run directory (curves, episodes, tokens); see server.py."""
