"""Observability of the coordinator: the Prometheus registry, its HTTP endpoint, the JSONL run log, the loop-lag watchdog."""
