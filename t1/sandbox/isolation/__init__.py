"""How a sandbox is confined on this host: namespaces, its root, its network, its limits, its processes.

Used by the local provider (t1/sandbox/local/) and, for sessions entering containers, the docker provider.

- bwrap.py: local sandbox trees, the bubblewrap init that confines a sandbox, and how sessions enter it.
- nsinit.py: the per-sandbox namespace init, spawning off the event loop, pidfd waits.
- holders.py: namespace holders end with the T1 process that started them; leftovers of dead runs killed.
- forker.py: process starts from a thread with a nearly empty file table, signals blocked.
- mountns.py: mount syscalls and the thread that builds each sandbox's mount namespace.
- rootfs.py: the copy-on-write root of a local sandbox: the host's root through an overlay of its own.
- pristine.py: the pristine system an overlay sandbox's verifier runs, out of the agent's reach.
- netns.py: a network namespace per sandbox; user-mode internet (slirp4netns) when allowed.
- cgroups.py: memory, process and CPU limits per sandbox through cgroups.
- agent_userns.py: the agent's inner user namespace (overlay root, T1 as root).
- make_agent_userns.py: the helper that makes it: `python -I -S make_agent_userns.py PID`.
- supervisor_bin.py: an execute-only bash for the shells' supervisors (non-dumpable).
"""
