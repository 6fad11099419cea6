"""The trainer plane: off-policy actor-critic PPO on DeepSpeed with routing replay (t1-trainer).

  advantages.py  reward placement, GAE, normalisation (numpy, pure)
  losses.py      the PPO objective: surrogate, truncated IS, entropy, KL, value loss (torch, pure)
  batch.py       trajectories -> training sequences: validation, infra policy, staleness
  validation.py  is a trajectory record consistent enough to train on
  admission.py   a trajectory checked against the model it will train, before it is acknowledged
  packing.py     token-budget micro-batches packed into one row, per-sequence arrays in and out
  token_stats.py action-token logprobs and entropy, head and log-softmax in chunks (no T x V tensor)
  models.py      policy and critic models, replay around forwards
  attention.py   attention confined to each sequence of a packed row
  sequence_parallel.py  Ulysses sequence parallelism: a packed row shared by the ranks of a group
  learner.py     one PPO / critic warm-up / SFT step on the engines
  engine.py      process group and DeepSpeed engines
  buffer.py      durable trajectory buffer (SQLite) and committed steps
  checkpoint.py  engine checkpoints and RNG
  publish.py     weights/v{N} folders
  demos.py       SFT demonstrations
  sft.py         the warm start's SFT lifecycle: batches, lr, the weights a steered SFT keeps, the KL anchor
  core.py        stages, steps and the commit order that makes them durable
  service.py     TrainerService servicer
  app.py         the process: server, training loop, ranks, shutdown
"""
