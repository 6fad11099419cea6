"""Episodes: admitted in groups within the staleness bound, run, and their results handed on.

- scheduler.py: groups of G attempts per task, the global episode limit, staleness-bounded admission
- runner.py: RolloutRunner: build an Episode from config and a task, run it, hand on the result (a training
  episode's trajectory to the spool, an eval attempt's outcome to its job)
- generate_router.py: each episode's generate function (scripted, an eval job's pool, the run's pool) and its
  pools
"""
