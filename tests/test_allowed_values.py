"""Every allowed-value list is written twice, as a ``Literal`` type of a config dataclass field
(src/agentrl/config/sections.py) and as the schema's ``enum`` of that key (src/agentrl/resources/
config.schema.yaml): the schema refuses what the code does not know, the hint documents what the
code takes. Each pair must be the same set, walked from :class:`agentrl.config.Config` down."""

from __future__ import annotations

import dataclasses
import types
import typing
from pathlib import Path

import pytest
import yaml

from agentrl.config import Config

SCHEMA = yaml.safe_load((Path(__file__).resolve().parents[1] / "workflow/schemas/config.schema.yaml").read_text())


def _resolved(node: dict) -> dict:
    """The schema node with a local ``$ref`` followed (``#/$defs/name``)."""
    while "$ref" in node:
        target = SCHEMA
        for part in node["$ref"].removeprefix("#/").split("/"):
            target = target[part]
        node = target
    return node


def _schema_enum(node: dict) -> set | None:
    """The values a schema node allows, ``null`` left out; None when it lists none."""
    node = _resolved(node)
    if node.get("type") == "array":
        return _schema_enum(node.get("items", {}))
    if "enum" in node:
        return {value for value in node["enum"] if value is not None}
    options = [_schema_enum(option) for option in node.get("oneOf", []) + node.get("anyOf", [])]
    listed = [values for values in options if values]
    return set().union(*listed) if listed else None


def _literal_values(hint) -> set | None:
    if typing.get_origin(hint) is typing.Literal:
        return set(typing.get_args(hint))
    if typing.get_origin(hint) is tuple:  # a list of allowed values: the schema's items say them
        return _literal_values(typing.get_args(hint)[0])
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        found = [_literal_values(arg) for arg in typing.get_args(hint)]
        found = [values for values in found if values]
        return set().union(*found) if found else None
    return None


def _child_dataclass(hint):
    for arg in (hint, *typing.get_args(hint)):
        if dataclasses.is_dataclass(arg):
            return arg
    return None


def _object_schema(node: dict) -> dict:
    """The object form of a node that also takes a string or null (``oneOf`` its forms)."""
    node = _resolved(node)
    if "properties" in node:
        return node
    forms = [_object_schema(option) for option in node.get("oneOf", []) + node.get("anyOf", [])]
    return next((form for form in forms if "properties" in form), node)


def literal_keys(cls=Config, node=None, prefix=""):
    """(key, the field's Literal values, the schema node) for every Literal-typed key under ``cls``."""
    node = _resolved(node if node is not None else SCHEMA)
    hints = typing.get_type_hints(cls)
    for field in dataclasses.fields(cls):
        name = field.metadata.get("config_key", field.name)
        key = f"{prefix}{name}"
        sub = node.get("properties", {}).get(name)
        assert sub is not None, f"config key {key} ({cls.__name__}.{field.name}) has no schema entry"
        hint = hints[field.name]
        if typing.get_origin(hint) is dict:  # named entries: each one's schema is additionalProperties
            hint, sub = typing.get_args(hint)[1], _resolved(sub)["additionalProperties"]
        child = _child_dataclass(hint)
        if child is not None:
            yield from literal_keys(child, _object_schema(sub), f"{key}.")
        elif (values := _literal_values(hint)) is not None:
            yield key, values, sub


KEYS = list(literal_keys())


def test_the_walk_finds_the_literal_keys():
    keys = {key for key, *_ in KEYS}
    assert (
        len(keys) >= 25
        and {"sandbox.backend", "grpo.algorithm.loss_agg_mode", "ablations.arms.rl_data", "eval.reasoning"} <= keys
    ), keys


@pytest.mark.parametrize(("key", "values", "node"), KEYS, ids=[key for key, *_ in KEYS])
def test_each_literal_key_allows_in_the_schema_what_its_dataclass_allows(key, values, node):
    assert _schema_enum(node) == values, f"{key}: schema enum {_schema_enum(node)} != dataclass Literal {values}"
