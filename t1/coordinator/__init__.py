"""The control plane: episodes scheduled in groups, the spool to the trainer, weight sync, eval jobs (see app.py)."""
