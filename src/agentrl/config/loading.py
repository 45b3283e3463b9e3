"""Loading a config: the schema's validation with its defaults filled, the dataclasses built from
the result, the strict YAML reading of a config file and the stage CLIs' ``--config`` arguments.

Every problem is a :class:`~agentrl.config.sections.ConfigError` naming the key (and, for a file,
the file and line).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import types
import typing
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jsonschema
import yaml

from agentrl.config.checks import overlong_window_problems
from agentrl.config.sections import Config, ConfigError, ModelSourceConfig
from agentrl.config_schema import coerce_to_schema, load_schema


def _extend_with_defaults(validator_class):
    """A validator that fills in ``default`` values, as snakemake.utils.validate(set_default=True)."""
    validate_properties = validator_class.VALIDATORS["properties"]

    def set_defaults(validator, properties, instance, schema):
        if isinstance(instance, dict):
            for key, sub in properties.items():
                if "default" in sub and key not in instance:  # a $ref'd key too: its default sits beside the $ref
                    instance[key] = json.loads(json.dumps(sub["default"]))
        yield from validate_properties(validator, properties, instance, schema)

    return jsonschema.validators.extend(validator_class, {"properties": set_defaults})


_DefaultFillingValidator = _extend_with_defaults(jsonschema.Draft202012Validator)


def _key_path(error: jsonschema.ValidationError) -> str:
    return ".".join(str(p) for p in error.absolute_path) or "<top level>"


def _describe(error: jsonschema.ValidationError) -> str:
    if error.validator in ("oneOf", "anyOf") and error.context:
        # "not valid under any of the given schemas" says nothing; the branch of the right type
        # does (a wrong key in an object), else the list of types that would do
        specific = [e for e in error.context if e.validator != "type"]
        if specific:
            return _describe(max(specific, key=lambda e: len(e.absolute_path)))
        types_ = [e.validator_value for e in error.context]
        return f"'{_key_path(error)}' = {error.instance!r} has the wrong type; expected one of {types_}"
    key = _key_path(error)
    if error.validator == "additionalProperties":
        allowed = sorted(error.schema.get("properties", {}))
        unknown = sorted(set(error.instance) - set(allowed)) if isinstance(error.instance, dict) else []
        return f"unknown key(s) {unknown} under '{key}'; allowed keys: {allowed}"
    if error.validator == "enum":
        return f"'{key}' = {error.instance!r} is not allowed; choose one of {error.validator_value}"
    if error.validator == "type":
        return f"'{key}' = {error.instance!r} has the wrong type; expected {error.validator_value}"
    if error.validator == "propertyNames":
        return f"'{key}': {error.message}; allowed names: {error.validator_value.get('enum')}"
    return f"'{key}': {error.message}"


def validate_and_fill(
    raw: dict[str, Any], origin: str = "config", source_of: Callable[[tuple[str, ...]], str] | None = None
) -> dict[str, Any]:
    """Validate ``raw`` against the schema, filling defaults in place; raise ConfigError with every problem.

    ``source_of`` names where the value at a key path came from (a file, ``--config``); each
    problem is then prefixed by it.
    """
    if not isinstance(raw, dict):
        raise ConfigError(f"{origin}: the config must be a mapping, got {type(raw).__name__}")
    schema = load_schema()
    coerce_to_schema(raw, schema, schema)
    validator = _DefaultFillingValidator(schema)
    errors = sorted(validator.iter_errors(raw), key=lambda e: list(e.absolute_path))
    lines = [f"  - {_source_prefix(e, source_of)}{_describe(e)}" for e in errors]
    for path, value in _non_finite_numbers(raw, ()):
        where = f"{source_of(path)}: " if source_of else ""
        lines.append(f"  - {where}'{'.'.join(path)}' = {value!r}: not a finite number")
    if lines:
        raise ConfigError(f"{origin}: invalid configuration\n" + "\n".join(lines))
    return raw


def fill_derived_defaults(config: dict[str, Any]) -> dict[str, Any]:
    """Defaults that are another key's value, filled in place so the workflow's rules pass the
    number: ``reward.overlong.max_response_length: null`` is ``rollout.max_response_tokens`` (the
    penalty ramps to the end of the response budget, as upstream sets both). ``config`` is
    validated and its schema defaults filled (:func:`validate_and_fill`)."""
    overlong = config["reward"]["overlong"]
    if overlong["max_response_length"] is None:
        overlong["max_response_length"] = config["rollout"]["max_response_tokens"]
    return config


def _non_finite_numbers(value: Any, path: tuple[str, ...]) -> list[tuple[tuple[str, ...], float]]:
    """(key path, value) of every NaN or infinity: JSON Schema's ranges pass NaN (it compares false)."""
    if isinstance(value, float):
        return [] if math.isfinite(value) else [(path, value)]
    if isinstance(value, dict):
        return [found for key, sub in value.items() for found in _non_finite_numbers(sub, (*path, str(key)))]
    if isinstance(value, list):
        return [found for i, sub in enumerate(value) for found in _non_finite_numbers(sub, (*path, str(i)))]
    return []


def _source_prefix(error: jsonschema.ValidationError, source_of: Callable[[tuple[str, ...]], str] | None) -> str:
    if source_of is None:
        return ""
    path = tuple(str(p) for p in error.absolute_path)
    if error.validator == "additionalProperties" and isinstance(error.instance, dict):
        allowed = error.schema.get("properties", {})
        path += tuple(sorted(k for k in error.instance if k not in allowed))[:1]
    return f"{source_of(path)}: "


def _build(cls: Any, value: Any, key: str) -> Any:
    """Turn validated plain data into the (possibly nested) dataclass ``cls``."""
    origin = typing.get_origin(cls)
    if cls is ModelSourceConfig:  # a string is an id; a revision left out is the hub's main
        value = {"id": value, "revision": None} if isinstance(value, str) else {"revision": None, **value}
    if dataclasses.is_dataclass(cls):
        hints = typing.get_type_hints(cls)
        kwargs = {}
        for field in dataclasses.fields(cls):
            name = field.metadata.get("config_key", field.name)
            sub_key = f"{key}.{name}" if key else name
            if name not in value:
                raise ConfigError(f"missing config key '{sub_key}' (and the schema has no default for it)")
            kwargs[field.name] = _build(hints[field.name], value[name], sub_key)
        return cls(**kwargs)
    if origin is tuple:
        (item_type, _ellipsis) = typing.get_args(cls)
        return tuple(_build(item_type, v, f"{key}[{i}]") for i, v in enumerate(value))
    if origin is dict:
        _, value_type = typing.get_args(cls)
        return {k: _build(value_type, v, f"{key}.{k}") for k, v in value.items()}
    if origin in (typing.Union, types.UnionType):
        if value is None:
            return None
        non_none = [t for t in typing.get_args(cls) if t is not type(None)]
        return _build(non_none[0], value, key)
    if cls is float and isinstance(value, int):
        return float(value)
    return value


def load_config(raw: dict[str, Any] | None = None, origin: str = "config") -> Config:
    """Validate a plain config mapping (partial is fine: defaults fill the rest) into a :class:`Config`.

    Only what the schema says about each key (strings read as its types, unknown keys, types,
    ranges); no cross-key check: a stage that needs those calls :func:`check_cross_keys` itself
    (GRPO does), and the workflow runs them at load (:func:`check_workflow_config`).
    """
    data = fill_derived_defaults(validate_and_fill(json.loads(json.dumps(raw or {})), origin))
    return _build(Config, data, "")


class _StrictYamlLoader(yaml.SafeLoader):
    """YAML's safe loader refusing a key given twice in one mapping (PyYAML keeps the last silently)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: dict[Any, int] = {}
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=True)
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"key {key!r} given twice (first on line {seen[key]})", key_node.start_mark
                )
            seen[key] = key_node.start_mark.line + 1
        return super().construct_mapping(node, deep)


def read_config_yaml(path: str | Path) -> Any:
    """The YAML value of a config file, or the JSON value of a ``.json`` file (the workflow's jobs
    get theirs so: YAML 1.1 would read JSON's ``1e-05`` as a string); an unreadable file (missing, a
    folder, not UTF-8), a syntax error or a key given twice raises ConfigError naming the file and,
    for the syntax, the line."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"config file not found: {path}") from None
    except IsADirectoryError:
        raise ConfigError(f"{path}: is a folder, not a config file") from None
    except OSError as exc:
        raise ConfigError(f"{path}: cannot be read ({exc.strerror})") from None
    except UnicodeDecodeError as exc:
        line = _line_of_byte(path, exc.start)
        raise ConfigError(f"{path}: line {line}: not UTF-8 text (byte {exc.object[exc.start]:#04x})") from None
    if path.suffix == ".json":
        try:
            return json.loads(text)
        except json.JSONDecodeError as exc:
            raise ConfigError(f"{path}: not valid JSON at line {exc.lineno}, column {exc.colno}: {exc.msg}") from None
    try:
        return yaml.load(text, Loader=_StrictYamlLoader)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise ConfigError(f"{path}: not valid YAML{where}: {exc.problem or exc.context}") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML: {exc}") from None


def _line_of_byte(path: Path, offset: int) -> int:
    """The 1-based line holding byte ``offset`` of ``path``."""
    with open(path, "rb") as fh:
        return fh.read(offset).count(b"\n") + 1


def load_config_file(path: str | Path) -> Config:
    return load_config(read_config_yaml(path) or {}, origin=str(path))


def add_config_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_mutually_exclusive_group()
    group.add_argument(
        "--config",
        type=Path,
        help="YAML config file, or JSON for a .json file (what the Snakemake rules pass: results/config/<stage>-"
        "<hash>.json); keys left out take config.yaml's values (the schema defaults)",
    )
    group.add_argument("--config-json", help="config as a JSON string")


def config_from_args(args: argparse.Namespace) -> Config:
    """The config a stage CLI was given, with the overlong window checked against the response
    budget (:func:`agentrl.config.checks.overlong_window_problems`): each stage that rolls out
    scores with the penalty, and a stage run alone gets no workflow load-time check."""
    if getattr(args, "config_json", None):
        try:
            raw = json.loads(args.config_json)
        except json.JSONDecodeError as exc:
            raise ConfigError(f"--config-json is not valid JSON: {exc}") from None
        cfg, origin = load_config(raw, origin="--config-json"), "--config-json"
    elif getattr(args, "config", None):
        cfg, origin = load_config_file(args.config), str(args.config)
    else:
        cfg, origin = load_config({}), "config"
    problems = overlong_window_problems(cfg)
    if problems:
        raise ConfigError(f"{origin}: " + "; ".join(problems))
    return cfg
