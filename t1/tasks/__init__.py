"""Tasks, verifiers and rewards.

- spec.py: TaskSpec (instruction, environment, verifier, solution, steps, metadata) and its parts.
- provision.py: prepare a sandbox for a task (refusals, Dockerfile replay on local sandboxes, files,
  workdir/env/user, healthchecks); transfer.py: uploads through the Shell protocol (SetupError).
- toolchain.py, offline_pkgs.py: pytest and the offline installer stand-ins, for setup (the Dockerfile's RUN
  lines) and tests alike, and the one rule for what counts as installed (validate runs the same file).
- formats/: read Terminal-Bench 1 and Harbor / TB 2.x folders (task.toml schema 1.0-1.4, typed fields, every
  path kept in its folder), datasets, named sets.
- image/: the task's environment: its Dockerfile parsed, given container semantics (base images T1 stands in
  for), replayed in a local sandbox (ENTRYPOINT scripts too), or built by docker, cached by digest.
- needs/: needs_* reasons (t1/sandbox/needs.py) predicted from the folder alone (installer lines, test
  imports, refused features); `t1 tasks validate`.
- verify/: run the verifiers after the agent (Harbor's separate verifier environment too), their report, the
  tests a task declares, rewards (pure), whose fault a failure is (the infra_error rule, pure), oracle runs.
- synth/: the OOD training corpus and the learnable curriculum, and its n-gram and MinHash decontamination
  against benchmark tasks.

Typical episode use (the rollout worker): `req = sandbox_request(spec)`; after creating the sandbox and a
shell, `prov = await provision(shell, spec, provider.traits)`, then `await sandbox.end_setup()` (the verifier's
system is fixed there, before the agent acts); start the agent's shell with `prov.prefix()`; at the end
`report = await run_verifier(verifier_shell, phase.verifier, prov)` and `episode_reward(report, cfg.reward.mode)`.
"""
