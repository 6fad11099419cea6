"""The control plane: episodes scheduled in groups, the spool to the trainer, weight sync, eval jobs (see run/app.py).

Modules:
- model_setup.py: the policy's folder (made from its preset when missing) and its chat renderers (the local stack
  makes the folder, the run's parts the renderers)
- tasksource.py: tasks for eval jobs (sets, folders) and the endless shuffled training stream
- run/: the t1-coordinator process and the run it drives: its loops, start and shutdown order and phases, the parts
  built from config, the stages and steered SFT, run state and status, the run directory, progress and the
  end-of-run report on the console, garbage collection
- rollout/: episodes: the scheduler (groups, the global limit, staleness-bounded admission), the rollout runner,
  each episode's generate function
- spool/: what the coordinator keeps on disk so a crash loses nothing finished: the trajectory spool to the
  trainer and the episode journal of live episodes, each with its recovery
- trainer_side/: what talks to the trainer, made together once its address is known: the trainer link, weight
  sync, the trainer's status polled
- evals/: eval jobs: their runs, their SQLite store, their requests and limits, CoordinatorService (the gRPC face
  of eval jobs and run status), how the previous coordinator on the run dir ended
- local/: the local stack of a one-command run: the model, the task sets, child t1-inference and t1-trainer
  processes that die with the coordinator
"""
