"""Task folders read into TaskSpecs: Terminal-Bench 1 and Harbor / Terminal-Bench 2.x, datasets, named sets.

- load_tb1.py: read a Terminal-Bench 1 task folder (task.yaml, tests/, run-tests.sh, solution, Dockerfile).
- load_harbor.py: read a Harbor / Terminal-Bench 2.x task folder (task.toml, instruction.md, environment/,
  tests/, solution/, steps/).
- harbor_schema.py: Harbor task.toml schema 1.0-1.4: the keys of each table, env templates, the environment table.
- fields.py: typed reads of a task file, with errors naming file, field and problem.
- taskfiles.py: every path under a task folder resolves inside it, or the task is refused.
- dataset.py: find and load tasks: one folder (either format), a dataset of task folders, a named set.
"""
