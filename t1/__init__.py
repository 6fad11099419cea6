"""T1: train and evaluate long-horizon terminal agents with reinforcement learning.

Packages, lowest layer first (an import only points down a layer or stays in its own;
tests/test_import_graph.py checks it, docs/design.md explains it):
- v1/ (generated gRPC code), config/ (the typed config schema), workdir.py (one owner per directory),
  logsetup.py (process logging), errors.py (the exception tree: T1Error, InfraError, BadRequest, ...)
- metrics/ (Prometheus registry, run log, trackers), trajectory/ (the trajectory record, its codec,
  the spool's files), evals/ (eval statistics)
- model/ (model files and presets), routing/ (MoE routing records, R3)
- rpc/ (the gRPC layer)
- inference/ (the inference plane), trainer/ (the trainer plane)
- tito/ (exact-token buffers)
- sandbox/ (sandboxes, shells, providers)
- tasks/ (task folders, provisioning, verifiers, rewards, environment images)
- agent/ (the episode), gateway/ (the per-episode gateway harnesses call)
- view/ (the run viewer)
- coordinator/ (the control plane: the run's driver, rollouts, spool, eval jobs)
- cli/ (command lines)
"""

__version__ = "0.1.0"
