"""Reference resolution for the lowering: every ``$ref`` resolved locally (``$id`` base URIs,
``$anchor``, ``$dynamicAnchor`` where no ``$dynamicRef`` exists, JSON pointers) and its target
hoisted to ``#/$defs/pg<n>`` (``_hoist_refs``)."""

from __future__ import annotations

import urllib.parse
from collections.abc import Mapping
from typing import Any

from .pointers import unescape_pointer
from .values import _copy
from .walk import _children, _KeyHint, _nodes

__all__: list[str] = []


_DEFAULT_BASE = "https://portable-guided.invalid/root.json"


def _get(doc: Any, pointer: str) -> Any:
    node = doc
    for raw in pointer.split("/")[1:]:
        part = unescape_pointer(raw)
        if isinstance(node, list):
            node = node[int(part)]
        elif isinstance(node, Mapping):
            node = node[part]
        else:
            raise KeyError(pointer)
    return node


def _hoist_refs(doc: dict[str, Any], keys: _KeyHint | None = None) -> dict[str, Any]:
    """Resolve every ``$ref`` of ``doc`` and point it at a copy of its target in the root's
    ``$defs`` (``pg<n>``); base URIs and anchors are dropped once resolved. A ``$ref`` that
    cannot be resolved locally (remote, unknown anchor) is left as it is; a schema with
    ``$dynamicRef`` keeps its anchors (its dynamic scope is not modelled)."""
    keys = keys or _KeyHint.of(doc)
    dynamic = keys.may_hold("$dynamicRef") and _static_dynamic_refs(doc)
    resources: dict[str, str] = {}
    anchors: dict[str, str] = {}
    refs: list[tuple[dict[str, Any], str]] = []  # (node, absolute uri)
    root_base = _DEFAULT_BASE

    def visit(node: Any, pointer: str, base: str) -> None:
        if not isinstance(node, dict):
            return
        if isinstance(node.get("$id"), str) and node["$id"].startswith("#"):
            anchors.setdefault(f"{base}{node['$id']}", pointer)  # draft 6/7 plain-name id
        elif isinstance(node.get("$id"), str):
            base = urllib.parse.urljoin(base, node["$id"]).split("#")[0]
            resources.setdefault(base, pointer)
        for key in ("$anchor", *(() if dynamic else ("$dynamicAnchor",))):
            if isinstance(node.get(key), str):
                anchors.setdefault(f"{base}#{node[key]}", pointer)
        if isinstance(node.get("$ref"), str):
            refs.append((node, _absolute(base, node["$ref"])))
        for p, sub in _children(node, pointer):
            visit(sub, p, base)

    if isinstance(doc.get("$id"), str):
        root_base = urllib.parse.urljoin(_DEFAULT_BASE, doc["$id"]).split("#")[0]
    resources[root_base] = ""
    resources.setdefault(_DEFAULT_BASE, "")
    if keys.may_hold("$id", "$anchor", "$dynamicAnchor"):
        visit(doc, "", root_base)
    elif keys.may_hold("$ref", "$dynamicRef"):  # (a $dynamicRef may have become a $ref)
        # (most schemas: one base URI and no anchors, so no pointers to keep)
        refs = [(n, _absolute(root_base, n["$ref"])) for n in _nodes(doc)
                if isinstance(n, dict) and isinstance(n.get("$ref"), str)]
    if dynamic:
        return doc
    targets: dict[str, str] = {}
    # A target outside the subschema keywords (a custom `#/tenant_resourceDefinitions/x`)
    # was not walked above: its own references are collected as it is hoisted.
    collected = {id(node) for node, _ in refs}
    for node, uri in refs:  # (grows while it is read)
        resource, _, fragment = uri.partition("#")
        fragment = urllib.parse.unquote(fragment)
        if resource not in resources:
            continue
        if fragment == "" or fragment.startswith("/"):
            pointer = resources[resource] + fragment
        elif f"{resource}#{fragment}" in anchors:
            pointer = anchors[f"{resource}#{fragment}"]
        else:
            continue
        try:
            _get(doc, pointer)
        except (KeyError, IndexError, ValueError):
            continue
        if pointer not in targets:
            for inner in _nodes(_get(doc, pointer)):
                if (isinstance(inner, dict) and isinstance(inner.get("$ref"), str)
                        and id(inner) not in collected):
                    collected.add(id(inner))
                    refs.append((inner, _absolute(root_base, inner["$ref"])))
        name = targets.setdefault(pointer, f"pg{len(targets)}")
        node["$ref"] = f"#/$defs/{name}"
    resolved = {f"#/$defs/{n}" for n in targets.values()}
    # (`refs` holds every $ref of doc: none was added since)
    everything = all(node["$ref"] in resolved for node, _ in refs)
    # Copies, unless each target is a root definition that is dropped below (then nothing
    # else reaches it; most schemas).
    shared = everything and all(
        p.count("/") == 2 and p.startswith(("/$defs/", "/definitions/")) for p in targets)
    copies = {name: (_get(doc, pointer) if shared else _copy(_get(doc, pointer)))
              for pointer, name in targets.items()}

    def clean(tree: Any, root: bool) -> None:
        for node in _nodes(tree):  # (each node emptied before its children are read)
            if not isinstance(node, dict):
                continue
            for key in ("$id", "$anchor", "$dynamicAnchor"):
                node.pop(key, None)
            if not (root and node is tree):
                node.pop("$schema", None)
            # Every target is hoisted: what else $defs hold is unreachable.
            node.pop("$defs", None)
            node.pop("definitions", None)

    if everything:
        if keys.may_hold("$id", "$anchor", "$dynamicAnchor") or any(
                keys.count(k) > (k in doc) for k in ("$schema", "$defs", "definitions")):
            for c in copies.values():
                clean(c, False)
            clean(doc, True)
        else:  # (most schemas: these keywords at the root only)
            for c in copies.values():  # (a copy of the root holds them too)
                if isinstance(c, dict):
                    for key in ("$schema", "$defs", "definitions"):
                        c.pop(key, None)
            doc.pop("$defs", None)
            doc.pop("definitions", None)
        if copies:
            doc["$defs"] = copies
    elif copies:
        doc.setdefault("$defs", {})
        if isinstance(doc["$defs"], dict):
            doc["$defs"].update(copies)
    return doc


def _absolute(base: str, ref: str) -> str:
    # (a fragment resolves against the base as it is: the common case, no urljoin)
    return base + ref if ref.startswith("#") else urllib.parse.urljoin(base, ref)


def _static_dynamic_refs(doc: dict[str, Any]) -> bool:
    """Turn each ``$dynamicRef`` that resolves the way a ``$ref`` does into one: a JSON
    pointer, or a name no more than one ``$dynamicAnchor`` of the document holds (the dynamic
    scope can then only find the anchor the static resolution finds; 2020-12 §8.2.3.2).
    Whether any ``$dynamicRef`` is left."""
    nodes = [n for n in _nodes(doc) if isinstance(n, dict)]
    names: dict[str, int] = {}
    for n in nodes:
        if isinstance(n.get("$dynamicAnchor"), str):
            names[n["$dynamicAnchor"]] = names.get(n["$dynamicAnchor"], 0) + 1
    left = False
    for n in nodes:
        ref = n.get("$dynamicRef")
        if not isinstance(ref, str):
            continue
        fragment = ref.partition("#")[2]
        if "$ref" not in n and (fragment == "" or fragment.startswith("/")
                                or names.get(fragment, 0) <= 1):
            n["$ref"] = n.pop("$dynamicRef")
        else:
            left = True
    return left
