"""Tasks, verifiers and rewards.

- `spec`: TaskSpec (instruction, environment, verifier, solution, steps, metadata) and its parts.
- `load_tb1`, `load_harbor`, `dataset`: read Terminal-Bench 1 and Harbor / TB 2.x folders, datasets, named sets.
- `harbor_schema`: Harbor task.toml schema 1.0-1.4 (keys, env templates, the environment table).
- `provision`: prepare a sandbox for a task (refusals, Dockerfile replay on local sandboxes, files,
  workdir/env/user, healthchecks); `transfer`: uploads through the Shell protocol.
- `dockerfile` (syntax), `dockerplan` (container semantics, pure), `replay` (runs the plan), `base_images`
  (what T1 stands in for, toolchains checked), `entrypoint` (a plain ENTRYPOINT script as the first process).
- `needs`, `predict`, `installers`, `test_imports`, `validate`: needs_* reasons, predicted from the folder alone.
- `verifier`: run the tests after the agent (or every K turns with cleanup=True for process rewards);
  `separate`: Harbor's separate verifier environment; `toolchain` + `offline_pkgs`: pytest and the
  offline installer stand-ins for setup and tests; `report`: VerifierReport (with why) and parsers.
- `rewards`: count / fraction / binary rewards, multi-step combination, process rewards (pure).
- `oracle`: run reference solutions (oracle) or nothing (verify) in fresh sandboxes.
- `synth`: the OOD training corpus; `decontam`: n-gram and MinHash decontamination.

Typical episode use (the rollout worker): `req = sandbox_request(spec)`; after creating the sandbox and a
shell, `prov = await provision(shell, spec)`, then `await sandbox.end_setup()` (the verifier's system is fixed
there, before the agent acts); start the agent's shell with `prov.prefix()`; at the end
`report = await run_verifier(verifier_shell, phase.verifier, prov)` and `episode_reward(report, cfg.reward.mode)`.
"""
