"""Rewrite a schema of any supported draft into draft 2020-12 with the same meaning.

The lowering and every engine read draft 2020-12 only; a schema naming another draft in its
``$schema`` is rewritten here first (a new object; the input is untouched):

- keywords the declared draft does not know assert nothing there: they are dropped;
- before 2019-09 every sibling of ``$ref`` is ignored, ``$id`` included: only ``$ref`` is
  kept (and the ``definitions``/``$defs`` beside it, which assert nothing and which
  references point into);
- draft 4: ``id`` becomes ``$id``; a boolean ``exclusiveMaximum``/``exclusiveMinimum``
  turns its ``maximum``/``minimum`` into the numeric form;
- before 2020-12: a list ``items`` and its ``additionalItems`` become ``prefixItems`` and
  ``items``; ``dependencies`` (to draft 7) becomes ``dependentRequired``/``dependentSchemas``;
- a plain-name fragment ``$id`` (``"#foo"``, drafts 4 to 7) becomes ``$anchor``;
- 2019-09: ``$recursiveAnchor: true`` / ``$recursiveRef: "#"`` become a ``$dynamicAnchor`` /
  ``$dynamicRef`` pair with the 2019-09 meaning.

Only the schema's structure is walked: the names under ``properties`` (and the like) are user
data, and the values of ``enum``/``const``/``default``/``examples`` are never rewritten. A
JSON-pointer reference into something moved is rewritten to its new place; one into
something dropped is refused (:class:`GrammarSpecError`): it fails closed, never accepting
more than the declared draft does.
"""

from __future__ import annotations

import json
import re
import urllib.parse
from collections.abc import Mapping
from typing import Any

from .dialects import KEYWORDS, LATEST, Dialect, dialect_named, form
from .pointers import escape_pointer, unescape_pointer

__all__ = ["check_nested_dialects", "normalise"]

#: The base URI of a schema without ``$id`` (never fetched; as the runtime's ref check).
_LOCAL_BASE = "https://portable-guided.invalid/root.json"
#: ``$anchor``'s syntax in 2020-12 (drafts 6 and 7 also allowed ``:`` in a plain name).
_ANCHOR = re.compile(r"[A-Za-z_][-A-Za-z0-9._]*")
#: The ``$dynamicAnchor`` standing for 2019-09's ``$recursiveAnchor: true``.
RECURSIVE_ANCHOR = "pg_recursive"

Path = tuple[str, ...]


def normalise(schema: Any, dialect: Dialect) -> Any:
    """``schema``, read under ``dialect``, as a draft 2020-12 schema of the same meaning
    (without ``$schema``). A 2020-12 schema is returned as it is (not copied).

    >>> from portable_guided.json_schema.dialects import dialect_of
    >>> s = {"$schema": "http://json-schema.org/draft-04/schema#",
    ...      "maximum": 5, "exclusiveMaximum": True}
    >>> normalise(s, dialect_of(s))
    {'exclusiveMaximum': 5}
    """
    if dialect is LATEST:
        return schema
    from ..runtime.errors import GrammarSpecError

    walk = _Walk(dialect)
    try:
        out = walk.node(schema, (), (), _LOCAL_BASE)
        walk.finish()
    except GrammarSpecError:
        raise
    except ValueError as exc:  # e.g. an $id urllib cannot parse
        raise _error(f"schema not readable under {dialect.uri}: {exc}", "/") from None
    return out


def check_nested_dialects(schema: Any, dialect: Dialect) -> None:
    """Refuse a ``$schema`` below the root of ``schema`` naming a dialect other than
    ``dialect`` (an embedded resource of another draft: read as ``dialect`` it could accept
    more). Walks the structure, as :func:`normalise` does; call it only where the schema's
    text holds more than one ``"$schema"``."""
    stack: list[tuple[Any, Path, bool]] = [(schema, (), True)]
    while stack:
        node, path, is_schema = stack.pop()
        if isinstance(node, list):
            stack.extend((v, path + (str(i),), is_schema) for i, v in enumerate(node))
            continue
        if not isinstance(node, Mapping):
            continue
        if not is_schema:  # a map of names to subschemas
            stack.extend((v, path + (str(k),), True) for k, v in node.items())
            continue
        if path and "$schema" in node:
            inner = dialect_named(node["$schema"])
            if inner is not dialect and not reads_alike(node, inner, dialect):
                raise _error(_nested_dialect(node["$schema"], inner, dialect),
                             _pointer(path + ("$schema",)))
        for key, value in node.items():
            kind = form(key, LATEST) or form(key, dialect)
            if kind in ("schema", "schemas", "schema_or_list"):
                stack.append((value, path + (key,), True))
            elif kind in ("schema_map", "container", "schema_or_names"):
                stack.append((value, path + (key,), False))


#: Forms that assert nothing: a keyword in one of them, or unknown, reads alike.
_SILENT = (None, "annotation")


def reads_alike(schema: Any, declared: Dialect, outer: Dialect) -> bool:
    """Whether ``schema`` (a subschema whose ``$schema`` names ``declared``, inside a
    schema of dialect ``outer``) means the same read under either: every keyword in it and
    below has the same form in both drafts (or asserts nothing in both), no positional
    ``items`` list, no ``$id``/``id`` with a ``$ref`` below it, and no ``$ref`` beside
    other keywords where one draft ignores its siblings. Then the nested ``$schema`` needs
    no rewrite (GitHub schemas often embed definitions copied from a draft-4 file);
    otherwise it is refused."""
    siblings_ignored = (declared.rank < 3) != (outer.rank < 3)
    # A base URI (`id`, `$id`) changes nothing where no reference below resolves against
    # it (one from outside that names it is refused as unresolved when read otherwise).
    refs = '"$ref"' in json.dumps(schema)
    stack = [schema]
    while stack:
        node = stack.pop()
        if isinstance(node, bool):
            continue
        if not isinstance(node, Mapping):
            return False
        if "$ref" in node and siblings_ignored and len(node) > 1 + ("$schema" in node):
            return False
        for key, value in node.items():
            if key in ("$schema", "$comment"):
                if key == "$schema" and dialect_named(value) is not declared:
                    return False
                continue
            if key in ("$id", "id"):
                if refs:
                    return False
                continue
            if key == "items":  # one subschema means the same in every draft, a list not
                if not isinstance(value, (Mapping, bool)):
                    return False
                stack.append(value)
                continue
            inner, there = form(key, declared), form(key, outer)
            if inner != there and not (inner in _SILENT and there in _SILENT):
                return False
            kind = inner or there
            if kind in ("schema", "schema_or_list"):
                stack.append(value)
            elif kind == "schemas" and isinstance(value, list):
                stack.extend(value)
            elif kind in ("schema_map", "container") and isinstance(value, Mapping):
                stack.extend(value.values())
            elif kind == "schema_or_names" and isinstance(value, Mapping):
                stack.extend(v for v in value.values() if not isinstance(v, list))
    return True


def _nested_dialect(uri: Any, inner: Dialect, outer: Dialect) -> str:
    return (f"$schema {uri!r:.100} inside a {outer.name} schema is not supported (its "
            f"subschema uses keywords {inner.name} reads otherwise)")


def _error(message: str, pointer: str) -> Exception:
    """A :class:`~portable_guided.runtime.errors.GrammarSpecError` (imported here: the
    runtime imports this module)."""
    from ..runtime.errors import GrammarSpecError

    return GrammarSpecError(message, pointer=pointer)


def _pointer(path: Path) -> str:
    return "".join("/" + escape_pointer(p) for p in path)


class _Walk:
    """One normalisation: where each input schema went (``moved``: input path -> output
    path, None when dropped), the resources and the references to re-aim afterwards."""

    def __init__(self, dialect: Dialect) -> None:
        self.d = dialect
        self.legacy_ref = dialect.rank < 3  # $ref siblings ignored (drafts 4, 6, 7)
        self.id_key = "id" if dialect.rank == 0 else "$id"
        self.moved: dict[Path, Path | None] = {}
        #: resource URI -> (input path, output path) of its root.
        self.resources: dict[str, tuple[Path, Path]] = {_LOCAL_BASE: ((), ())}
        #: (output node, input path, base URI) of each $ref and of each $recursiveRef.
        self.refs: list[tuple[dict[str, Any], Path, str]] = []
        self.recursive_refs: list[tuple[dict[str, Any], Path, str]] = []
        #: Resources whose root has ``$recursiveAnchor: true`` (2019-09).
        self.anchored: set[str] = set()
        self.keys_seen: set[str] = set()
        #: (output node, schema to add to its allOf) once the node is written.
        self.extra_branches: list[tuple[dict[str, Any], dict[str, Any]]] = []

    def fail(self, path: Path, message: str) -> Exception:
        return _error(f"{message} (under {self.d.uri})", _pointer(path) or "/")

    # -- the walk ----------------------------------------------------------------------------
    def node(self, schema: Any, old: Path, new: Path, base: str) -> Any:
        self.moved[old] = new
        if not isinstance(schema, Mapping):
            return schema  # a boolean schema (or an invalid one: the meta check says so)
        if self.legacy_ref and "$ref" in schema:
            # Drafts 4 to 7: $ref alone counts; its siblings ($id too) are ignored.
            kept = {k: v for k, v in schema.items() if k in ("$ref", "definitions", "$defs")}
            for key in schema:
                if key not in kept:
                    self.moved[old + (key,)] = None
            schema = kept
        out: dict[str, Any] = {}
        base, root = self._base(schema, old, new, base, out)
        for key, value in schema.items():
            self.keys_seen.add(key)
            if key == "$recursiveAnchor" and self.d.rank == 3:
                if not isinstance(value, bool):
                    raise self.fail(old + (key,), f"$recursiveAnchor {value!r:.60} is not a "
                                                  "boolean")
                if value and root:  # read at a resource's root only
                    out["$dynamicAnchor"] = RECURSIVE_ANCHOR
                    self.anchored.add(base)
            else:
                self._keyword(key, value, schema, old, new, base, out)
        while self.extra_branches and self.extra_branches[-1][0] is out:
            branches = out.get("allOf")
            out["allOf"] = [*(branches if isinstance(branches, list) else ()),
                            self.extra_branches.pop()[1]]
        return out

    def _base(self, schema: Mapping[str, Any], old: Path, new: Path, base: str,
              out: dict[str, Any]) -> tuple[str, bool]:
        """The base URI inside ``schema`` and whether it is a resource's root, writing the
        2020-12 form of its identifier (``$id``, ``$anchor``) into ``out``."""
        ident = schema.get(self.id_key)
        if not isinstance(ident, str):
            return base, not old
        where = old + (self.id_key,)
        uri, _, fragment = ident.partition("#")
        if fragment and self.d.rank >= 3:
            raise self.fail(where, f"$id {ident!r:.100} has a fragment")
        if fragment and not _ANCHOR.fullmatch(fragment):
            # Not an anchor 2020-12 can name. A pointer ("#/definitions/a") is reached by
            # where it is anyway; a `$ref` to another name is left unresolvable, and the
            # engines refuse it.
            fragment = ""
        if fragment:
            out["$anchor"] = fragment  # a location-independent identifier
        if not uri:
            return base, not old
        base = urllib.parse.urljoin(base, uri).split("#")[0]
        out["$id"] = uri
        self.resources[base] = (old, new)
        return base, True

    def _keyword(self, key: str, value: Any, schema: Mapping[str, Any], old: Path, new: Path,
                 base: str, out: dict[str, Any]) -> None:
        here = old + (key,)
        kind = form(key, self.d)
        if key in ("$defs", "definitions"):
            # Containers: they assert nothing, and references point into them.
            out[key] = self._map(value, here, new + (key,), base)
        elif key == "$schema":
            # Only the root's is read; one inside naming another draft is not supported.
            inner = dialect_named(value)
            if old and inner is not self.d and not reads_alike(schema, inner, self.d):
                raise self.fail(here, _nested_dialect(value, inner, self.d))
        elif kind is None:
            if key in _KNOWN_SOMEWHERE:
                self.moved[here] = None  # unknown to this draft: asserts nothing, dropped
            else:
                out[key] = value  # unknown to every draft: an annotation everywhere
                self.moved[here] = new + (key,)
        elif kind == "id":
            pass  # written by _base
        elif key == "items" and kind == "schema_or_list":
            self._items(value, schema, old, new, base, out)
        elif key == "additionalItems":
            if "items" not in schema or not isinstance(schema["items"], list):
                self.moved[here] = None  # read only beside a list of items
        elif kind == "schema":
            out[key] = self.node(value, here, new + (key,), base)
        elif kind == "schema_map":
            out[key] = self._map(value, here, new + (key,), base)
        elif kind == "schemas":
            out[key] = self._list(value, here, new + (key,), base)
        elif kind == "schema_or_names":
            self._dependencies(value, schema, here, new, base, out)
        elif kind == "content":
            # Draft 7 lets a validator assert them; the engines cannot: refused, not ignored.
            raise self.fail(here, f"{key} (which draft 7 may assert) is not supported")
        elif kind == "boolean":
            self._exclusive(key, value, schema, here, out)
        elif key in ("maximum", "minimum") and self.d.rank == 0:
            if schema.get("exclusiveM" + key[1:]) is not True:
                out[key] = value  # else _exclusive writes it as the exclusive bound
        elif kind == "ref":
            out[key] = value
            self.refs.append((out, old, base))
        elif kind == "recursive_ref":
            if value != "#":
                raise self.fail(here, f"$recursiveRef {value!r:.60} is not \"#\"")
            out["$dynamicRef"] = "#" + RECURSIVE_ANCHOR
            self.recursive_refs.append((out, old, base))
        else:  # a value, data or an annotation: the same in every draft that knows it
            out[key] = value

    def _map(self, value: Any, old: Path, new: Path, base: str) -> Any:
        if not isinstance(value, Mapping):
            return value
        self.moved[old] = new
        return {name: self.node(sub, old + (name,), new + (name,), base)
                for name, sub in value.items()}

    def _list(self, value: Any, old: Path, new: Path, base: str) -> Any:
        if not isinstance(value, list):
            return value
        self.moved[old] = new
        return [self.node(sub, old + (str(i),), new + (str(i),), base)
                for i, sub in enumerate(value)]

    def _items(self, items: Any, schema: Mapping[str, Any], old: Path, new: Path, base: str,
               out: dict[str, Any]) -> None:
        if not isinstance(items, list):
            out["items"] = self.node(items, old + ("items",), new + ("items",), base)
            return
        out["prefixItems"] = self._list(items, old + ("items",), new + ("prefixItems",), base)
        if "additionalItems" in schema:
            out["items"] = self.node(schema["additionalItems"], old + ("additionalItems",),
                                     new + ("items",), base)

    def _dependencies(self, deps: Any, schema: Mapping[str, Any], old: Path, new: Path,
                      base: str, out: dict[str, Any]) -> None:
        if not isinstance(deps, Mapping):
            raise self.fail(old, f"dependencies must be an object, got {type(deps).__name__}")
        target = out
        if "dependentRequired" in schema or "dependentSchemas" in schema:
            # (2019-09) beside its successors: one more allOf branch, so neither overwrites
            # the other.
            branches = schema.get("allOf")
            index = len(branches) if isinstance(branches, list) else 0
            target = {}
            new = new + ("allOf", str(index))
            self.extra_branches.append((out, target))
        required: dict[str, Any] = {}
        schemas: dict[str, Any] = {}
        for name, dep in deps.items():
            if isinstance(dep, list):
                required[name] = dep
                self.moved[old + (name,)] = None  # a list of names is not a schema
            else:
                schemas[name] = self.node(dep, old + (name,),
                                          new + ("dependentSchemas", name), base)
        if required:
            target["dependentRequired"] = required
        if schemas:
            target["dependentSchemas"] = schemas

    def _exclusive(self, key: str, value: Any, schema: Mapping[str, Any], here: Path,
                   out: dict[str, Any]) -> None:
        """Draft 4: ``exclusiveMaximum: true`` makes ``maximum`` exclusive; alone, or
        false, it asserts nothing."""
        if not isinstance(value, bool):
            raise self.fail(here, f"{key} must be a boolean in draft 4, got {value!r:.60}")
        bound = "maximum" if key == "exclusiveMaximum" else "minimum"
        if value and bound in schema:
            out[key] = schema[bound]

    # -- after the walk -------------------------------------------------------------------------
    def finish(self) -> None:
        """Re-aim the references (:meth:`_fix_ref`); make a ``$recursiveRef`` whose resource
        has no ``$recursiveAnchor: true`` the plain ``$ref: "#"`` it is in 2019-09."""
        if self.d.rank == 3 and {"contains", "unevaluatedItems"} <= self.keys_seen:
            # 2019-09 does not count the items `contains` matched as evaluated; 2020-12 does.
            raise self.fail((), "unevaluatedItems beside contains is not supported")
        for node, old, base in self.refs:
            self._fix_ref(node, old, base)
        for node, old, base in self.recursive_refs:
            if base not in self.anchored:
                if "$ref" in node:
                    raise self.fail(old, "$recursiveRef beside $ref is not supported")
                node["$ref"] = "#"
                del node["$dynamicRef"]

    def _fix_ref(self, node: dict[str, Any], old: Path, base: str) -> None:
        """Re-aim a JSON-pointer ``$ref`` at where its target went; refuse one whose target
        was dropped (fail closed: the declared draft could not reach it as a schema)."""
        ref = node["$ref"]
        if not isinstance(ref, str):
            return
        # (urljoin leaves a fragment alone against a base it cannot join to, e.g. a URN.)
        joined = base + ref if ref.startswith("#") else urllib.parse.urljoin(base, ref)
        target, _, fragment = joined.partition("#")
        if fragment and not fragment.startswith("/"):
            return  # an anchor: carried as $anchor
        root = self.resources.get(target)
        if root is None:
            return  # not in this document: the runtime refuses it
        tokens = urllib.parse.unquote(fragment).split("/")[1:] if fragment else []
        path = root[0] + tuple(unescape_pointer(t) for t in tokens)
        moved = self._where(path, old)
        if moved[:len(root[1])] != root[1]:
            raise self.fail(old + ("$ref",), f"$ref {ref!r:.100} leaves its resource")
        if path[len(root[0]):] != moved[len(root[1]):]:
            pointer = _pointer(moved[len(root[1]):])
            head = ref.partition("#")[0]
            node["$ref"] = f"{head}#{urllib.parse.quote(pointer, safe=_POINTER_SAFE)}"

    def _where(self, path: Path, at: Path) -> Path:
        """Where the input location ``path`` is in the output (through its deepest walked
        ancestor); refuses one inside something dropped."""
        for cut in range(len(path), -1, -1):
            if path[:cut] in self.moved:
                dest = self.moved[path[:cut]]
                if dest is None:
                    raise self.fail(at + ("$ref",), f"$ref points to {_pointer(path)!r:.100}, "
                                                    f"which {self.d.name} ignores")
                return dest + path[cut:]
        return path


_POINTER_SAFE = "/~:@!$&'()*+,;="

#: Keywords some draft reads as more than an annotation: dropped where the declared draft does
#: not know them (the engines read 2020-12, or their own rules, and may assert them).
_KNOWN_SOMEWHERE = frozenset(k for k, forms in KEYWORDS.items()
                             if set(forms.values()) - {"annotation", "data"} or k == "const")
