"""The TITO + R3 fidelity bench: measure.py (one setting), sweep.py (many), cli.py (`python -m bench.fidelity`)."""
