"""The coordinator load bench: run.py (scales, the wiring, `python -m bench.load`), episode.py (measuring
wrappers around the coordinator's rollout path), metrics.py (clocks, meters), report.py (the table).

Arrows run one way: run -> episode, report -> metrics.
"""
