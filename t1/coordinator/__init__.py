"""The control plane: episodes scheduled in groups, the spool to the trainer, weight sync, eval jobs (see app.py).

Modules:
- app.py: the t1-coordinator process: its loops and queues drawn, start order, phases, shutdown order
- parts.py: Parts: the long-lived components built from config, closed in app.py's order; background loops
- stages.py: the stages of a training run: warm-start demonstrations, evals, training, the report
- run_state.py: what the run is doing now: phase, the eval job of an eval phase, the trainer side
- run_status.py: GetRunStatus's answer, from what owns each number
- status.py: the trainer's GetStatus polled into metrics and the run log; the turn rate
- run_dirs.py: which run directory a training run uses, and whether it starts fresh or resumes
- scheduler.py: groups of G attempts per task, the global episode limit, staleness-bounded admission
- rollout.py: rollout workers: build an Episode from config and a task, run it, hand on the result
- tasksource.py: tasks for eval jobs (sets, folders) and the endless shuffled training stream
- generate_router.py: each episode's generate function (scripted, an eval job's pool, the run's pool) and its
  pools
- model_setup.py: the policy's folder (made from its preset when missing) and its chat renderers
- spool.py: the experience spool: append-only, bounded, crash-safe (frames: t1/trajectory/spool_files.py)
- spool_recovery.py: every intact frame of a damaged spool file found, the damaged bytes kept
- journal.py: the episode journal: each live episode's finished turns on disk
- journal_recovery.py: what a restarted coordinator does with the journals of unfinished episodes
- trainer_link.py: the spool streamed to TrainerService.PushTrajectories, acks applied by id
- weights.py: weight sync: follow the trainer's versions, every inference server loads each one
- service.py: CoordinatorService: the gRPC face of eval jobs and run status
- eval_request.py: EvalRequest (an eval job as asked), its SubmitEvalRequest form, and its checks against
  config limits (RequestError naming the field)
- evals.py: eval jobs: every (task, attempt) once, each result recorded as it lands, resumed after a crash
- jobs.py: the eval job store (SQLite): jobs and every finished attempt
- run_report.py: RunReport: the run's report as a value; to_json() is report.json
- console_report.py: the end-of-run report on the console: solve rates with intervals, per family; SFT curve; fidelity
- progress.py: progress on the console: a live display on a terminal, plain lines otherwise
- sft_steer.py: steered SFT: train on demonstrations until the validation solve rate stops rising
- local.py: the local stack of a one-command run: the model, task sets, child services
- children.py: child t1-inference and t1-trainer processes of the local run (ChildFailed)
- lifeline.py: children die with their parent: the parent-death signal armed, then exec
- crash.py: a fatal signal's traceback in logs/crash.txt, so crashed eval jobs are not resumed into it
- gc_policy.py: garbage collection tuned for thousands of live episodes
"""
