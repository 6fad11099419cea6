"""Read a YAML config, apply `--set a.b=value` overrides, validate, and explain every error by key path."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from t1.config.schema import T1Config
from t1.errors import BadRequest

_PYDANTIC_MESSAGES = {
    "extra_forbidden": "unknown key",
    "missing": "required key is missing",
}


class ConfigError(BadRequest):
    """A config that cannot be used; `problems` holds one 'key.path: reason' line per problem."""

    def __init__(self, source: str, problems: list[str]) -> None:
        self.source = source
        self.problems = problems
        super().__init__(f"{source}: " + "; ".join(problems))


def _key_path(loc: Iterable[int | str]) -> str:
    parts: list[str] = []
    for item in loc:
        if isinstance(item, int):
            parts.append(f"[{item}]")
        else:
            parts.append(("." if parts else "") + str(item))
    return "".join(parts) or "<root>"


def format_validation_error(err: ValidationError) -> list[str]:
    """One line per problem: the dotted key path and the reason."""
    lines = []
    for e in err.errors():
        loc = [p for p in e["loc"] if not (isinstance(p, str) and p.startswith("function-after"))]
        reason = _PYDANTIC_MESSAGES.get(e["type"], e["msg"])
        if e["type"] not in _PYDANTIC_MESSAGES and "input" in e and not isinstance(e["input"], (dict, list)):
            reason = f"{reason} (got {e['input']!r})"
        reason = reason.removeprefix("Value error, ")
        # A cross-section rule names its own key path in the message.
        lines.append(reason if not loc and e["type"] == "value_error" else f"{_key_path(loc)}: {reason}")
    return lines


def parse_override(text: str) -> tuple[list[str], Any]:
    """`a.b.c=value` -> (['a', 'b', 'c'], value parsed as a YAML scalar or flow collection)."""
    key, sep, raw = text.partition("=")
    if not sep or not key or any(not part for part in key.split(".")):
        raise ConfigError("--set", [f"{text!r}: expected KEY.PATH=VALUE"])
    try:
        value = yaml.safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError as exc:
        raise ConfigError("--set", [f"{key}: value is not valid YAML ({exc})"]) from None
    return key.split("."), value


def apply_overrides(data: dict[str, Any], overrides: Iterable[str]) -> dict[str, Any]:
    """Return a copy of `data` with every override applied; intermediate mappings are created."""
    result = _deep_copy(data)
    for text in overrides:
        path, value = parse_override(text)
        node = result
        for i, part in enumerate(path[:-1]):
            child = node.get(part)
            if child is None:
                child = node[part] = {}
            if not isinstance(child, dict):
                raise ConfigError("--set", [f"{'.'.join(path[: i + 1])}: is not a mapping, cannot set "
                                            f"{'.'.join(path)}"])
            node = child
        node[path[-1]] = value
    return result


def _deep_copy(data: Mapping[str, Any]) -> dict[str, Any]:
    return {k: _deep_copy(v) if isinstance(v, Mapping) else v for k, v in data.items()}


def read_yaml(path: Path) -> dict[str, Any]:
    """Read a YAML mapping, with errors that name the file and the line."""
    source = str(path)
    if not path.is_file():
        raise ConfigError(source, ["<file>: no such file" if not path.exists() else "<file>: not a regular file"])
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}" if mark else "<file>"
        raise ConfigError(source, [f"{where}: invalid YAML ({getattr(exc, 'problem', exc)})"]) from None
    except UnicodeDecodeError:
        raise ConfigError(source, ["<file>: not UTF-8 text"]) from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(source, [f"<root>: expected a mapping, got {type(data).__name__}"])
    return data


def _check_files(cfg: T1Config) -> list[str]:
    problems = []
    tls = cfg.auth.tls
    if tls.enabled:
        for name in ("cert_file", "key_file", "ca_file"):
            value = getattr(tls, name)
            if value is not None and not value.is_file():
                problems.append(f"auth.tls.{name}: file not found ({value})")
    for name in cfg.tasks.train + cfg.tasks.eval:
        if name not in cfg.tasks.sets:
            problems.append(f"tasks: set {name!r} is used but not defined in tasks.sets")
    return problems


def validate(data: Mapping[str, Any], source: str = "<config>") -> T1Config:
    """Validate a mapping against the schema, raising ConfigError with every problem."""
    try:
        cfg = T1Config.model_validate(data)
    except ValidationError as err:
        raise ConfigError(source, format_validation_error(err)) from None
    problems = _check_files(cfg)
    if problems:
        raise ConfigError(source, problems)
    return cfg


def load_config(path: str | Path | None, overrides: Iterable[str] = ()) -> T1Config:
    """Load a config file (or defaults when `path` is None), apply overrides, validate."""
    data = read_yaml(Path(path)) if path is not None else {}
    return validate(apply_overrides(data, overrides), str(path) if path else "<defaults>")
