"""The local stack of a one-command run: what is not configured remotely is started here, and dies with it.

- local_stack.py: LocalStack: the model, the task sets, the child services started and supervised
- children.py: child t1-inference and t1-trainer processes of the local run (ChildFailed)
- lifeline.py: children die with their parent: the parent-death signal armed, then exec
  (`python -m t1.coordinator.local.lifeline`)
"""
