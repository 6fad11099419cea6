"""The trainer side: what talks to the trainer, made together once its address is known (run_state.TrainerSide).

- trainer_link.py: the spool streamed to TrainerService.PushTrajectories, acks applied by id
- weights.py: weight sync: follow the trainer's versions, every inference server loads each one
- status.py: the trainer's GetStatus polled into metrics and the run log; the turn rate
"""
