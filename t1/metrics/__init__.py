"""Observability of the coordinator: the Prometheus registry, its HTTP endpoint, the JSONL run log, the loop-lag
watchdog.

Modules:
- registry.py: every Prometheus metric of the coordinator, registered once on T1's own registry
- http.py: the /metrics endpoint on a background thread
- runlog.py: the JSONL run log: one JSON object per line, flushed per line
- trackers.py: every metric of the run by step and wall time, in TensorBoard and W&B
- watchdog.py: event-loop lag: how late the loop wakes, and the callbacks that block it
- write_faults.py: the run's files that cannot be written now (transcripts, run log, job database)
"""
