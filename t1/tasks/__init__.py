"""Tasks, verifiers and rewards.

- spec.py: TaskSpec (instruction, environment, verifier, solution, steps, metadata) and its parts;
  fields.py: typed reads of a task file with errors naming file, field and problem.
- load_tb1.py, load_harbor.py, dataset.py: read Terminal-Bench 1 and Harbor / TB 2.x folders, datasets, named
  sets; harbor_schema.py: Harbor task.toml schema 1.0-1.4; taskfiles.py: every task path stays in its folder.
- provision.py: prepare a sandbox for a task (refusals, Dockerfile replay on local sandboxes, files,
  workdir/env/user, healthchecks); transfer.py: uploads through the Shell protocol (SetupError).
- dockerfile.py (syntax), dockerplan.py (container semantics, pure), replay.py (runs the plan), base_images.py
  (what T1 stands in for, toolchains checked), entrypoint.py (a plain ENTRYPOINT script as the first process),
  context_files.py (where a built file came from: COPY/ADD read back).
- docker_build.py: `docker build` of a task's environment, cached by digest, given to the docker provider.
- predict.py, installers.py, test_imports.py, validate.py: needs_* reasons (t1/sandbox/needs.py), predicted
  from the folder alone.
- verifier.py: run the tests after the agent (or every K turns with cleanup=True for process rewards);
  separate.py: Harbor's separate verifier environment; toolchain.py + offline_pkgs.py: pytest and the
  offline installer stand-ins for setup and tests; report.py: VerifierReport (with why) and parsers;
  declared.py: the tests a task declares, counted from its files on the host.
- rewards.py: count / fraction / binary rewards, multi-step combination, process rewards (pure);
  outcome.py: whose fault a failure is (the infra_error rule, pure).
- oracle.py: run reference solutions (oracle) or nothing (verify) in fresh sandboxes.
- synth/: the OOD training corpus and the learnable curriculum; decontam.py: n-gram and MinHash
  decontamination.

Typical episode use (the rollout worker): `req = sandbox_request(spec)`; after creating the sandbox and a
shell, `prov = await provision(shell, spec, provider.traits)`, then `await sandbox.end_setup()` (the verifier's
system is fixed there, before the agent acts); start the agent's shell with `prov.prefix()`; at the end
`report = await run_verifier(verifier_shell, phase.verifier, prov)` and `episode_reward(report, cfg.reward.mode)`.
"""
