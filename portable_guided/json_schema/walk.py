"""Walks over a schema's subschemas: with their JSON pointers (:func:`iter_schemas`,
``_walk``), in preorder (``_nodes``), mapped innermost first (:func:`map_schemas`,
``_map_bottom_up``), and the keywords a schema's JSON text may hold (``_KeyHint``). Values of
``enum``, ``const``, ``default`` and ``examples`` are data, never walked."""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from typing import Any

from .dialects import (
    DATA_KEYWORDS,
    SCHEMA_LIST_KEYWORDS,
    SCHEMA_MAP_KEYWORDS,
    SUBSCHEMA_KEYWORDS,
)
from .keywords import _LISTS, _MAPS, _SUB
from .pointers import escape_pointer

__all__ = ["iter_schemas", "node_patterns", "map_schemas"]


#: Keywords holding one subschema, a list of them (with a draft-4 ``items`` list), and the
#: order :func:`_children` visits keywords in.
_SUB_KEYS = frozenset(_SUB)
_MAP_KEY_SET = frozenset(_MAPS)
_LIST_KEYS = frozenset((*_LISTS, "items"))
_CHILD_RANK = {k: i for i, k in enumerate((*_SUB, *_MAPS, *_LISTS))}

#: Keywords holding subschemas (what ``_Lowerer.node`` descends into).
_CHILD_KEYS = frozenset((*_SUB, *_MAPS, *_LISTS))


def _children(node: Mapping[str, Any], pointer: str) -> list[tuple[str, Any]]:
    """The values below ``node`` that hold subschemas, with their JSON pointers: each
    subschema keyword's value, each entry of a map of them, each item of a list of them, in
    keyword order (:func:`_child_keywords`); only the keys ``node`` holds are read."""
    out: list[tuple[str, Any]] = []
    for key, value in _child_keywords(node):
        if isinstance(value, list):
            if key in _LIST_KEYS:
                out.extend((f"{pointer}/{key}/{i}", sub) for i, sub in enumerate(value))
        elif key in _SUB_KEYS:
            if isinstance(value, (Mapping, bool)):
                out.append((f"{pointer}/{key}", value))
        elif key in _MAP_KEY_SET and isinstance(value, Mapping):
            out.extend((f"{pointer}/{key}/{_esc(name)}", sub) for name, sub in value.items())
    return out


def _child_keywords(node: Mapping[str, Any]) -> list[tuple[str, Any]]:
    """The keywords of ``node`` that hold subschemas, with their values, in the order of
    :func:`_children` (a subschema, a map, then a list of them; a draft-4 ``items`` list
    last): only the keys present are looked at."""
    present = [(k, v) for k, v in node.items() if k in _CHILD_KEYS]
    if len(present) > 1:
        present.sort(key=_child_rank)
    return present


def _child_rank(item: tuple[str, Any]) -> int:
    key, value = item
    return len(_CHILD_RANK) if key == "items" and isinstance(value, list) else _CHILD_RANK[key]


def _subschemas(node: dict[str, Any]) -> list[Any]:
    """The direct subschemas of ``node`` in the order of :func:`_children`."""
    out: list[Any] = []
    for key, value in _child_keywords(node):
        if key in _MAPS:
            if isinstance(value, dict):
                out.extend(value.values())
        elif isinstance(value, list):
            if key in _LIST_KEYS:
                out.extend(value)
        elif isinstance(value, (dict, bool)) and key in _SUB_KEYS:
            out.append(value)
    return out


def _nodes(node: Any) -> Iterator[Any]:
    """Every subschema of ``node`` and ``node`` itself, in the order of :func:`_walk` (parents
    first, children in keyword order; a node's children are read when the walk resumes after
    it, so a caller may change the node first)."""
    stack = [node]
    while stack:
        node = stack.pop()
        yield node
        if isinstance(node, dict) and not _CHILD_KEYS.isdisjoint(node):
            stack.extend(reversed(_subschemas(node)))


def _walk(node: Any, pointer: str = "") -> Iterator[tuple[str, Any]]:
    """``node`` and every value below it that :func:`_children` reaches, with their JSON
    pointers, parents first (without recursion: an iterative walk is several times
    faster, and the walks run on every compile)."""
    stack = [(pointer, node)]
    while stack:
        pointer, node = stack.pop()
        yield pointer, node
        if (type(node) is dict or isinstance(node, Mapping)) and not _CHILD_KEYS.isdisjoint(
                node.keys()):
            stack.extend(reversed(_children(node, pointer)))


_esc = escape_pointer


def _refs(doc: Any) -> Iterator[str]:
    for node in _nodes(doc):
        if isinstance(node, dict) and isinstance(node.get("$ref"), str):
            yield node["$ref"]


def _map_bottom_up(s: Any, fn: Any) -> Any:
    """``fn`` applied to every subschema of ``s``, children first (in place)."""
    if not isinstance(s, dict):
        return s
    if _CHILD_KEYS.isdisjoint(s):
        return fn(s)  # (a leaf)
    for key, sub in _child_keywords(s):
        if key in _MAPS:
            if isinstance(sub, dict):
                for k, v in sub.items():  # (values replaced, no key added: safe)
                    if isinstance(v, dict):
                        sub[k] = _map_bottom_up(v, fn)
        elif isinstance(sub, list):
            if key in _LIST_KEYS:
                for i, v in enumerate(sub):
                    if isinstance(v, dict):
                        sub[i] = _map_bottom_up(v, fn)
        elif isinstance(sub, dict) and key in _SUB_KEYS:
            s[key] = _map_bottom_up(sub, fn)
    return fn(s)


class _KeyHint:
    """Which keywords a schema cannot hold, read from its JSON text: a keyword absent from
    the text is in no subschema (the converse need not hold: a property may be named
    ``$id``). Text with ``\\u`` escapes (a keyword could be spelled with them) is written
    out again first."""

    def __init__(self, text: str) -> None:
        self.text = text
        self._counts: dict[str, int] = {}

    @classmethod
    def of(cls, schema: Any) -> _KeyHint:
        return cls(json.dumps(schema))

    def may_hold(self, *keys: str) -> bool:
        return any(self.count(k) for k in keys)

    def count(self, key: str) -> int:
        """At least the number of subschemas that hold ``key``."""
        if key not in self._counts:
            if not self._counts and "\\u" in self.text:
                self.text = json.dumps(json.loads(self.text))
            self._counts[key] = self.text.count(f'"{key}"')
        return self._counts[key]


# Keywords whose values are subschemas, maps of subschemas, or lists of subschemas (from the
# one keyword table, json_schema/dialects.py; ``items`` may be a list before 2020-12), in
# the order :func:`iter_schemas` visits them.
_SCHEMA_KEYS = SUBSCHEMA_KEYWORDS
_MAP_KEYS = SCHEMA_MAP_KEYWORDS
_ITER_LIST_KEYS = (*SCHEMA_LIST_KEYWORDS, "items")


def iter_schemas(node: Any, pointer: str = "") -> Iterator[tuple[str, Mapping[str, Any]]]:
    """Every (sub)schema object of ``node`` with its JSON pointer, parents first, children
    in keyword order (values of ``enum``, ``const``, ``default`` and ``examples`` are data,
    not schemas)."""
    for where, sub in _walk(node, pointer):
        if type(sub) is dict or isinstance(sub, Mapping):
            yield where, sub


def node_patterns(node: Mapping[str, Any]) -> list[str]:
    """The regexes of one schema object: its ``pattern`` and its ``patternProperties`` names."""
    patterns = [node["pattern"]] if isinstance(node.get("pattern"), str) else []
    if isinstance(node.get("patternProperties"), Mapping):
        patterns += list(node["patternProperties"])
    return patterns


def _children_mapped(schema: Mapping[str, Any], fn: Any) -> dict[str, Any]:
    """A copy of ``schema`` with ``fn`` applied to each subschema (data values left alone)."""
    out: dict[str, Any] = {}
    for key, value in schema.items():
        if key in DATA_KEYWORDS:
            out[key] = value
        elif key in _MAP_KEYS and isinstance(value, Mapping):
            out[key] = {k: fn(v) for k, v in value.items()}
        elif key in _SCHEMA_KEYS or key in _ITER_LIST_KEYS:
            out[key] = fn(value)
        else:
            out[key] = value
    return out


def map_schemas(schema: Any, fn: Any) -> Any:
    """``schema`` with ``fn`` applied to every subschema object, innermost first (``fn``
    returns the node or its replacement; values of ``enum``, ``const``, ``default`` and
    ``examples`` are data, left alone). Unchanged parts are copied."""
    if isinstance(schema, list):
        return [map_schemas(s, fn) for s in schema]
    if not isinstance(schema, Mapping):
        return schema
    return fn(_children_mapped(schema, lambda child: map_schemas(child, fn)))
