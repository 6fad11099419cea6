"""The docker provider: a container per sandbox on a Docker engine, its sessions through T1's own SSH path.

- docker_provider.py: DockerProvider: a container per sandbox, shells through the embedded SSH server; images
  built by the builder it is given (t1/tasks/image/docker_build.py).
- docker_engine.py: the Docker Engine side: containers, limits, labels, sweep.
- docker_pristine.py: the pristine system of a docker sandbox for its verifier.
"""
