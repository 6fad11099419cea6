"""What the coordinator keeps on disk so that a crash loses neither a finished trajectory nor a completed turn.

- trajectory_spool.py: Spool: the experience spool to the trainer: append-only, bounded, crash-safe (frames:
  t1/trajectory/spool_files.py)
- spool_recovery.py: every intact frame of a damaged spool file found, the damaged bytes kept
- journal.py: the episode journal: each live episode's finished turns on disk
- journal_recovery.py: what a restarted coordinator does with the journals of unfinished episodes
"""
