"""The typed config schema of every T1 process, and its YAML loader."""

from t1.config.loader import ConfigError, load_config, validate
from t1.config.schema import T1Config

__all__ = ["ConfigError", "T1Config", "load_config", "validate"]
