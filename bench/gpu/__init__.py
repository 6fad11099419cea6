"""The GPU kit: bench/gpu/run.sh measures inference, R3 fidelity, the trainer and long context on one GPU."""
