"""The sandbox plane: where episodes run their shells.

Modules:
- types.py: the seams: CommandResult, Shell, Sandbox, SandboxProvider (and its SandboxTraits: images,
  internet), SandboxRequest, SandboxRecord, SandboxLost, SandboxHostLost, SandboxGone, SweepsUnclaimed
- factory.py: build_provider(cfg): local, ssh, command or docker
- pool.py: SandboxPool: bounded, fault-tolerant acquisition from any provider; reattach
- needs.py: the needs_* reports: what a task needs that this host or provider cannot give
- run_lease.py: which run a sandbox belongs to, and whether that run is live (local service, docker labels)
- loopback_port.py: a listening socket on a sandbox's own loopback, held by T1 (local and docker)
- ssh/: shells over SSH whatever serves them: SshSandbox, SshShell, the framed-shell protocol, TerminalShell;
  the providers for machines T1 does not run (an SSH inventory, create/destroy commands); a throwaway sshd
- local/: the default provider: LocalProvider, the embedded SSH server, the host that runs local sandboxes and
  the sandbox service process that outlives the coordinator (its client and wire)
- isolation/: how a sandbox is confined here: bubblewrap trees and the per-sandbox namespace init, holders,
  process starts, mount namespaces, the copy-on-write root and the verifier's pristine system, network
  namespaces, cgroups, the agent's inner user namespace, the supervisors' execute-only bash
- verifier/: the verifier's uid, the directories only it may use, its environment and its entry
- docker/: DockerProvider: a container per sandbox on a Docker engine, its sessions through the embedded SSH
  server, its verifier's pristine system

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

The default provider is `local/` over `isolation/`: one bubblewrap init per sandbox whose namespaces
every session enters, through the embedded SSH server, with the verifier's uid, folders and entry in
`verifier/`. Threat model: docs/security.md.
"""

from t1.sandbox.factory import build_provider
from t1.sandbox.pool import SandboxPool
from t1.sandbox.ssh.ssh_sandbox import SshEndpoint, SshSandbox
from t1.sandbox.ssh.ssh_shell import SshShell
from t1.sandbox.ssh.terminal import TerminalShell
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
