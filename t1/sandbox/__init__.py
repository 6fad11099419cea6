"""The sandbox plane: where episodes run their shells.

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
  acted, the attempt's own failure after (`t1.tasks.outcome`). The pool drops such sandboxes on
  release and hands out a healthy one next.
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
