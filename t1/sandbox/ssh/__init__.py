"""Shells over SSH, whatever serves them, and the providers for machines T1 does not run itself.

- ssh_sandbox.py: SshSandbox: one SSH connection per sandbox (any provider), a second for verifier shells,
  its shells and SFTP transfers; SshEndpoint.
- ssh_shell.py: SshShell: a persistent framed bash with timeouts, output caps and restarts.
- framing.py: the framed-shell protocol as pure functions: sentinels, the supervisor script, frame scan, caps.
- terminal.py: TerminalShell: an interactive bash on a PTY rendered by pyte.
- remote.py: providers for machines T1 does not run: a fixed SSH inventory, create/destroy commands.
- sshd.py: a throwaway OpenSSH server on loopback, for tests and benchmarks.
"""
