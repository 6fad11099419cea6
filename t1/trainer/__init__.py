"""The trainer plane: off-policy actor-critic PPO on DeepSpeed with routing replay (t1-trainer).

  advantages.py  reward placement, GAE, normalisation (numpy, pure)
  losses.py      PPO surrogate, truncated IS, value loss, KL, diagnostics (torch, pure)
  batch.py       trajectories -> training sequences: validation, infra policy, staleness, micro-batches
  models.py      policy and critic models, padded batches, replay around forwards
  learner.py     one PPO / critic warm-up / SFT step on the engines
  engine.py      process group and DeepSpeed engines
  buffer.py      durable trajectory buffer (SQLite) and committed steps
  checkpoint.py  engine checkpoints and RNG
  publish.py     weights/v{N} folders
  demos.py       SFT demonstrations
  core.py        stages, steps and the commit order that makes them durable
  service.py     TrainerService servicer
  app.py         the process: server, training loop, ranks, shutdown
"""
