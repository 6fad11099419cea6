"""The typed config schema of every T1 process, and its YAML loader.

Modules:
- schema.py: T1Config: the one typed schema of every process (imports without torch)
- loader.py: YAML in, `--set` overrides, validation, every error named by its key path (ConfigError)
- base.py: the base class of every section: strict, immutable, documented
- shared.py: what every process shares: auth, TLS, logging, metrics, server addresses
- coordinator.py: the coordinator's server, run directory, spool, eval jobs, watchdog
- rollout.py: episodes: agent format, limits, sampling, concurrency
- sandbox.py: the sandbox plane: providers, the pool, shell limits
- tasks.py: task sets, verifiers, rewards, decontamination
- inference.py: the inference plane: servers, backends, the client pool, OpenAI endpoints
- trainer.py: the trainer: RL algorithm, warm start, DeepSpeed, publishing
- limits.py: bounds on what a client may ask of a service; every request field is checked against them
- reference.py: the configuration reference generated from the schema (README embeds it; a test keeps them
  equal)
"""

from t1.config.loader import ConfigError, load_config, validate
from t1.config.schema import T1Config

__all__ = ["ConfigError", "T1Config", "load_config", "validate"]
