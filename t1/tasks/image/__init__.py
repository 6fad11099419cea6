"""A task's environment: its Dockerfile read, given container semantics, replayed in a local sandbox or built.

- dockerfile.py: parse a Dockerfile into instructions (the syntax: continuations, heredocs, JSON forms, --flags).
- dockerplan.py: give the instructions their meaning: the replay plan a local sandbox runs (pure).
- base_images.py: the base images a local sandbox stands in for, what each sets, the toolchains checked.
- dockerfile_replay.py: run a Dockerfile's replay plan inside a sandbox, as `docker build` would.
- entrypoint.py: a plain ENTRYPOINT script runs as a local sandbox's first process.
- context_files.py: where a file the built environment holds came from (COPY/ADD read back).
- docker_build.py: `docker build` of a task's environment by the engine, cached by digest, for the docker
  provider.
"""
