"""The sandbox plane: where episodes run their shells.

Modules:
- types.py: the seams: CommandResult, Shell, Sandbox, SandboxProvider (and its SandboxTraits: images,
  internet), SandboxRequest, SandboxRecord, SandboxLost, SandboxHostLost, SandboxGone, SweepsUnclaimed
- factory.py: build_provider(cfg): local, ssh, command or docker
- pool.py: SandboxPool: bounded, fault-tolerant acquisition from any provider; reattach
- needs.py: the needs_* reports: what a task needs that this host or provider cannot give
- ssh_sandbox.py: SshSandbox: one SSH connection per sandbox, its shells and SFTP transfers
- ssh_shell.py: SshShell: a persistent framed bash with timeouts, output caps and restarts
- framing.py: the framed-shell protocol as pure functions: sentinels, supervisor script, frame scan, caps
- terminal.py: TerminalShell: an interactive bash on a PTY rendered by pyte
- local.py: LocalProvider: sandboxes as fresh trees served by the embedded SSH server
- local_server.py: the embedded SSH server: loopback only, key auth, every session in bubblewrap
- local_host.py: LocalSandboxHost: what runs local sandboxes (SSH server, trees, holders, cgroups, uids)
- service.py: the local sandbox service: local sandboxes in a process that outlives the coordinator
- service_client.py: the coordinator's side of it: find or start it, attach, ask (ServiceFailed)
- service_wire.py: its control wire: JSON lines, requests, socket paths
- bwrap.py: local sandbox trees, the bubblewrap init, how sessions enter
- rootfs.py: the copy-on-write root of a local sandbox
- mountns.py: mount syscalls and the thread that builds each sandbox's mount namespace
- nsinit.py: the per-sandbox namespace init, spawning off the event loop, pidfd waits
- holders.py: namespace holders end with the T1 process that started them; leftovers killed
- forker.py: process starts from a thread with a nearly empty file table, signals blocked
- agent_userns.py: the agent's inner user namespace (overlay root, T1 as root)
- make_agent_userns.py: the helper that makes it: `python -I -S make_agent_userns.py PID`
- netns.py: a network namespace per sandbox; user-mode internet when allowed
- loopback_port.py: a listening socket on a sandbox's own loopback, held by T1
- cgroups.py: memory, process and CPU limits per sandbox through cgroups
- pristine.py: the pristine system a local verifier runs, out of the agent's reach
- verifier_role.py: the verifier's uid, the directories only it may use, how it enters
- verifier_env.py: the verifier's environment: from system and test dirs only
- enter_verifier.py: enter a sandbox as its verifier without passing through the agent's uid
- supervisor_bin.py: an execute-only bash for the shells' supervisors
- docker_provider.py: DockerProvider: a container per sandbox, shells through T1's own SSH path; images built
  by the builder it is given (t1/tasks/image/docker_build.py)
- docker_engine.py: the Docker Engine side: containers, limits, labels, sweep
- docker_pristine.py: the pristine system of a docker sandbox for its verifier
- remote.py: providers for machines T1 does not run: an SSH inventory, create/destroy commands
- run_lease.py: which run a sandbox belongs to, and whether that run is live
- sshd.py: a throwaway OpenSSH server on loopback, for tests and benchmarks

Use it like this::

    from t1.sandbox import SandboxPool, SandboxRequest, build_provider

    provider = build_provider(cfg.sandbox)           # local | ssh | command
    pool = SandboxPool(provider, cfg.sandbox.pool)
    async with pool.acquire(SandboxRequest(allow_network=False)) as sandbox:
        await sandbox.upload("task/files", "/app")    # file or directory, over SFTP
        shell = await sandbox.open_shell()            # persistent bash, one per episode
        result = await shell.run("cd /app && ls", timeout_s=30)
        result.output, result.exit_code, result.timed_out, result.truncated, result.shell_restarted
        await shell.write_file("/app/x.py", b"print(1)")
        data = await shell.read_file("/logs/verifier/reward.txt")
        term = await sandbox.open_shell(terminal=True)  # a `Terminal`: send_keys / screen / keystrokes
        verifier = await sandbox.open_shell(role=ShellRole.VERIFIER)  # out of the agent's reach (local)
    await pool.close()                                # destroys what is left, then closes the provider

Contracts:
- `Shell.run(command, timeout_s)` never raises for what the command did: a timeout interrupts it
  (SIGINT, then SIGKILL, then a shell restart) and says so in the `CommandResult`; a shell that
  died (`exit`, `exec ...`) is restarted in the same cwd with `shell_restarted=True`.
- `SandboxLost` means the sandbox or its connection is gone: an infra error before the agent
  acted, the attempt's own failure after (`t1.tasks.verify.outcome`), except `SandboxHostLost` (the
  local sandbox service died with it: T1's fault, always an infra error). The pool drops such
  sandboxes on release and hands out a healthy one next.
- Sandboxes that outlive their coordinator (`SandboxProvider.survives_coordinator`: ssh, command,
  docker, local in a coordinator's run) are reattached by a later one from `sandbox.record()`
  (JSON: `SandboxRecord.to_json`/`from_json`) with `provider.reattach(record)` or
  `pool.reattach(record)`; `SandboxGone` when the sandbox is no longer there or not this run's.
- Output is capped (head and tail kept, `truncated=True`), decoded as UTF-8 with replacement
  and stripped of ANSI sequences; `output_bytes` counts what the command really printed.
- `SandboxProvider.create(SandboxRequest) -> Sandbox` and `destroy(sandbox)`; `pool.acquire()`
  always destroys (or, for the ssh inventory, resets) the sandbox when the block exits.

Modules: `framing` (the protocol, pure), `ssh_shell` (SshShell), `terminal` (TerminalShell),
`ssh_sandbox` (one SSH connection per sandbox, a second for verifier shells), `local_server` +
`bwrap` + `nsinit` + `local` (the default provider: one bubblewrap init per sandbox whose
namespaces every session enters), `verifier_role` + `enter_verifier` (the verifier's uid, folders
and entry), `netns` (a network namespace per sandbox, slirp4netns for internet), `cgroups`
(aggregate limits), `supervisor_bin` (the non-dumpable supervisor), `remote` (ssh inventory and
command providers), `pool`, `factory`, and `sshd` (a throwaway OpenSSH server for tests and
benchmarks). Threat model: docs/security.md.
"""

from t1.sandbox.factory import build_provider
from t1.sandbox.pool import SandboxPool
from t1.sandbox.ssh_sandbox import SshEndpoint, SshSandbox
from t1.sandbox.ssh_shell import SshShell
from t1.sandbox.terminal import TerminalShell
from t1.sandbox.types import (
    CommandResult,
    Sandbox,
    SandboxLost,
    SandboxProvider,
    SandboxRequest,
    Shell,
    ShellRole,
    Terminal,
)

__all__ = [
    "CommandResult",
    "Sandbox",
    "SandboxLost",
    "SandboxPool",
    "SandboxProvider",
    "SandboxRequest",
    "Shell",
    "ShellRole",
    "SshEndpoint",
    "SshSandbox",
    "SshShell",
    "Terminal",
    "TerminalShell",
    "build_provider",
]
