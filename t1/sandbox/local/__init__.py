"""The local provider: sandboxes on this host, served by T1's embedded SSH server, in a service that outlives the
coordinator (how they are confined: t1/sandbox/isolation/).

- local_provider.py: LocalProvider: sandboxes as fresh trees served by the embedded SSH server.
- local_server.py: the embedded SSH server: loopback only, key auth, every session in bubblewrap (the docker
  provider's sessions go through it too).
- local_host.py: LocalSandboxHost: what runs local sandboxes (SSH server, trees, holders, cgroups, uids).
- service.py: the local sandbox service: local sandboxes in a process that outlives the coordinator
  (`python -m t1.sandbox.local.service CONFIG`).
- service_client.py: the coordinator's side of it: find or start it, attach, ask (ServiceFailed).
- service_wire.py: its control wire: JSON lines, requests, socket paths.
"""
