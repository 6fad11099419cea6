"""The run: the t1-coordinator process, the parts it builds, the stages it drives and what it shows.

- app.py: the t1-coordinator process: its loops and queues drawn, start order, phases, shutdown order
- parts.py: Parts: the long-lived components built from config, closed in app.py's order; background loops
- stages.py: the stages of a training run: warm-start demonstrations, evals, training, the report
- sft_steer.py: steered SFT: train on demonstrations until the validation solve rate stops rising
- run_state.py: what the run is doing now: phase, the eval job of an eval phase, the trainer side
- run_status.py: GetRunStatus's answer, from what owns each number
- run_dirs.py: which run directory a training run uses, and whether it starts fresh or resumes
- progress.py: progress on the console: a live display on a terminal, plain lines otherwise
- run_report.py: RunReport: the run's report as a value; to_json() is report.json
- console_report.py: the end-of-run report on the console: solve rates with intervals, per family; SFT curve;
  fidelity
- gc_policy.py: garbage collection tuned for thousands of live episodes
"""
