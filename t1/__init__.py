"""T1: train and evaluate long-horizon terminal agents with reinforcement learning."""

__version__ = "0.1.0"
