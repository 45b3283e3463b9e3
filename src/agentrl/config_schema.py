"""The config schema and what it declares beyond validation.

``resources/config.schema.yaml`` is the single source of keys, types and defaults
(:mod:`agentrl.config` validates against it). Two of its declarations are read here: the types
a string is read as (Snakemake passes nested ``--config`` values and PyYAML passes ``1e-5`` as
strings), and ``x-rerun: false``, which marks the keys that change only speed, parallelism or
bookkeeping, so that the rules leave them out of what they compare (rules/common.smk).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

SCHEMA_PATH = Path(__file__).resolve().parent / "resources" / "config.schema.yaml"


def load_schema() -> dict[str, Any]:
    with open(SCHEMA_PATH, encoding="utf-8") as fh:
        return yaml.safe_load(fh)


# --------------------------------------------------------------------------- coercion
# YAML 1.2 core-schema scalars. Snakemake reads a nested ``--config key='{a: 2e-4}'`` with YAML's
# BaseLoader (every scalar a string), and PyYAML (YAML 1.1) reads ``1e-5`` (no dot) as a string.
_INTEGER = re.compile(r"[-+]?[0-9]+")
_FLOAT = re.compile(r"[-+]?(\.[0-9]+|[0-9]+(\.[0-9]*)?)([eE][-+]?[0-9]+)?|[-+]?\.(inf|Inf|INF)|\.(nan|NaN|NAN)")


def _schema_node(node: dict[str, Any], root: dict[str, Any]) -> dict[str, Any]:
    """``node`` with a local ``$ref`` (``#/$defs/...``) resolved."""
    ref = node.get("$ref")
    if not ref:
        return node
    target: Any = root
    for part in ref.removeprefix("#/").split("/"):
        target = target[part]
    return {**target, **{k: v for k, v in node.items() if k != "$ref"}}


def _branches(node: dict[str, Any], root: dict[str, Any]) -> list[dict[str, Any]]:
    """``node`` and, depth first, every branch of its ``oneOf``/``anyOf`` (``$ref`` resolved)."""
    node = _schema_node(node, root)
    found = [node]
    for keyword in ("oneOf", "anyOf"):
        for branch in node.get(keyword, []):
            found += _branches(branch, root)
    return found


def _declared_types(node: dict[str, Any], root: dict[str, Any]) -> set[str]:
    """The JSON types ``node`` admits: its own ``type`` and those of its ``oneOf``/``anyOf`` branches."""
    types_: set[str] = set()
    for branch in _branches(node, root):
        declared = branch.get("type")
        types_ |= {declared} if isinstance(declared, str) else set(declared or ())
    return types_


def _child_node(node: dict[str, Any], key: str, root: dict[str, Any]) -> dict[str, Any]:
    """The schema of ``key`` inside the object schema ``node`` or one of its branches (empty when none says)."""
    branches = _branches(node, root)
    for branch in branches:
        if key in branch.get("properties", {}):
            return branch["properties"][key]
    for branch in branches:
        extra = branch.get("additionalProperties")
        if isinstance(extra, dict):
            return extra
    return {}


def _items_node(node: dict[str, Any], root: dict[str, Any]) -> dict[str, Any]:
    """The schema of the items of the array schema ``node`` or of its first array branch."""
    for branch in _branches(node, root):
        items = branch.get("items")
        if isinstance(items, dict):
            return items
    return {}


def _coerce_scalar(text: str, types_: set[str]) -> Any:
    """``text`` read as the first of the declared types it spells (YAML 1.2 core); else unchanged.

    Null is read first (``'null'`` at a ``[string, "null"]`` key is None); a declared string type
    then keeps every other text, so only keys without one read booleans and numbers.
    """
    if "null" in types_ and text in ("null", "Null", "NULL", "~"):
        return None
    if "string" in types_:
        return text
    if "boolean" in types_ and text.lower() in ("true", "false"):
        return text.lower() == "true"
    if types_ & {"integer", "number"} and _INTEGER.fullmatch(text):
        return int(text)
    if "number" in types_ and _FLOAT.fullmatch(text):
        return float(text.lower().replace(".inf", "inf").replace(".nan", "nan"))
    return text


def coerce_to_schema(value: Any, node: dict[str, Any], root: dict[str, Any]) -> Any:
    """``value`` with each string read as its schema's declared type: ``'2e-4'`` at a number key is 2e-4.

    The declared types are the key's ``type`` and those of its ``oneOf``/``anyOf`` branches
    (``sft.from``: null or a model source, so ``'null'`` is None and a hub id stays a string).
    Only keys the schema types as non-strings change (a string key keeps ``'123'``); a string that
    spells none of its key's types stays a string for validation to report. Mappings and lists are
    changed in place (Snakemake's ``config`` is one shared dict).
    """
    if isinstance(value, dict):
        for key in value:
            value[key] = coerce_to_schema(value[key], _child_node(node, str(key), root), root)
    elif isinstance(value, list):
        items = _items_node(node, root)
        for index, item in enumerate(value):
            value[index] = coerce_to_schema(item, items, root)
    elif isinstance(value, str):
        types_ = _declared_types(node, root)
        return _coerce_scalar(value, types_) if types_ else value
    elif isinstance(value, float) and value.is_integer() and "integer" in _declared_types(node, root):
        # YAML's 2.0 at an integer key: JSON Schema counts it an integer, but range(2.0) fails in a stage
        return int(value)
    return value


# --------------------------------------------------------------------------- what re-runs
def rerun_keys(values: dict[str, Any], schema: dict[str, Any] | None = None) -> dict[str, Any]:
    """The key paths of ``values`` whose change re-runs a stage, each with its value.

    A key marked ``x-rerun: false`` in the schema (speed, parallelism, bookkeeping) is left out,
    with everything under it. A mapping of fixed keys is walked into; any other value (a list,
    a mapping of free names such as ``eval.checkpoints``) is one key.
    """
    root = schema or load_schema()
    found: dict[str, Any] = {}

    def walk(value: Any, node: dict[str, Any], path: str) -> None:
        node = _schema_node(node, root)
        if node.get("x-rerun") is False:
            return
        if isinstance(value, dict) and "properties" in node:
            for key in sorted(value):
                walk(value[key], _child_node(node, key, root), f"{path}.{key}" if path else key)
        else:
            found[path] = value

    walk(values, root, "")
    return found


def rerun_free_keys(schema: dict[str, Any] | None = None) -> list[str]:
    """The key paths the schema marks ``x-rerun: false`` (changing them re-runs nothing)."""
    root = schema or load_schema()
    found = []

    def walk(node: dict[str, Any], path: str) -> None:
        node = _schema_node(node, root)
        if node.get("x-rerun") is False:
            found.append(path)
            return
        for key, sub in node.get("properties", {}).items():
            walk(sub, f"{path}.{key}" if path else key)

    walk(root, "")
    return found
