"""Exact rewrites of a JSON schema into forms the engines enforce, and the soundness checks
that refuse what an engine would read differently.

:func:`lower` runs on every ``json_schema`` spec before an engine compiles it (both engines'
json compile paths call :func:`engine_schema_text`). Every rewrite is an exact equivalence under
JSON Schema 2020-12 (the instances a lowered schema accepts are the instances the original
accepts; pinned by the JSON Schema Test Suite and by property-based tests against the
``jsonschema`` validator, ``tests/runtime/test_json_lowering.py``); a rewrite that would not
be exact in a given schema is skipped, leaving the keyword for the engine to enforce or
refuse. The rewrites:

- ``$ref`` is resolved locally (``$id`` base URIs, ``$anchor``, ``$dynamicAnchor`` where no
  ``$dynamicRef`` exists, JSON pointers) and every target is hoisted to ``#/$defs/pg<n>``;
- ``allOf`` is merged into its parent (and ``$ref`` beside other keywords, where the target is
  not recursive) where the conjunction is expressible keyword by keyword;
- ``anyOf``/``oneOf`` beside other keywords are distributed over the branches, ``false``
  branches dropped;
- ``not`` of simple forms, ``if``/``then``/``else``, ``dependentRequired`` and
  ``dependentSchemas`` become ``anyOf``; ``unevaluatedProperties``/``unevaluatedItems`` become
  ``additionalProperties``/``items`` where no applicator remains beside them;
- keywords of one instance type on a schema without ``type`` are split per type;
- a standard ``format`` becomes the ``pattern`` of our language for it
  (``json_schema.formats``: exact, or a sound subset where the schema is not negated).

The pieces: :mod:`.references` (resolution and hoisting), :mod:`.algebra` (merge, negation,
disjointness), :mod:`.refusals` (what an engine would still read differently).
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from .algebra import (
    MAX_BRANCHES,
    _declared,
    _has_type,
    _merge_some,
    _no_inline,
    _NotExact,
    _only_type,
    _pairwise_disjoint,
    _requires_false,
    _type_list,
    _types,
    merge,
    negate,
)
from .errors import EmptyLanguage
from .formats import FORMATS
from .keywords import (
    _ANNOTATIONS,
    _COUNTS,
    _FAMILY,
    _KEYWORDS,
    _LISTS,
    _MAPS,
    _STRING_KW,
    _SUB,
    _TYPES,
)
from .references import _hoist_refs
from .values import _copy, _key, has_type
from .walk import (
    _CHILD_KEYS,
    _LIST_KEYS,
    _SUB_KEYS,
    _child_keywords,
    _KeyHint,
    _map_bottom_up,
    _refs,
)

__all__ = ["engine_schema_text", "lower", "needs_lowering", "refuse_unsatisfiable"]


_log = logging.getLogger(__name__)

#: Keywords whose subschemas apply to the instance itself (their annotations count for
#: unevaluatedProperties/unevaluatedItems of the schema that holds them).
_IN_PLACE = frozenset(("allOf", "anyOf", "oneOf", "not", "if", "then", "else",
                       "dependentSchemas"))

#: The formats JSON Schema 2020-12 defines. Others are custom: annotations that an
#: implementation which does not know them must not validate (section 7.2.3), so they are
#: dropped; the standard ones become the pattern of their language (``json_schema.formats``),
#: or are refused.
STANDARD_FORMATS = frozenset(FORMATS)

#: Formats whose check in ``jsonschema`` accepts values the format does not (``email``: an
#: ``@`` anywhere; ``regex``: Python's dialect, not ECMA-262's).
_LOOSE_CHECKS = frozenset(("email", "idn-email", "regex"))


@functools.lru_cache(maxsize=256)
def engine_schema_text(text: str) -> str:
    """The schema an engine compiles for the schema JSON ``text``: :func:`lower`'s result,
    as JSON text (cached: ``auto`` lowers once for both engines)."""
    schema = json.loads(text)
    try:
        if isinstance(schema, dict):
            if not needs_lowering(schema):
                return text  # (most schemas: nothing to rewrite, no new text)
            # `schema` is ours (just parsed): lowered in place, no copy.
            lowered = _lower_owned(schema, approximate=True, keys=_KeyHint(text))
        else:
            lowered = schema
        if lowered is False:
            # If the narrowing left nothing, keep the keywords (the engines refuse them).
            lowered = lower(json.loads(text))
    except (RecursionError, ValueError, TypeError, KeyError, IndexError) as exc:
        # A shape the rewrites did not foresee: the engines get the schema as it is (and
        # the soundness checks still run on it).
        _log.warning("schema not lowered (%s: %s)", type(exc).__name__, exc)
        return text
    if lowered is True:
        lowered = {}  # the same language; engines want an object at the root
    return json.dumps(lowered, ensure_ascii=False, separators=(",", ":"))


def refuse_unsatisfiable(text: str) -> None:
    """Raise :class:`~portable_guided.runtime.engines.EmptyLanguage` when the lowered schema
    ``text`` is ``false``: the schema accepts no JSON value (``allOf`` with ``false``, ``not:
    {}``, a ``oneOf`` of equal branches), so a request could produce nothing."""
    if text.strip() == "false":
        raise EmptyLanguage("the grammar accepts no output at all: the schema accepts no "
                            "JSON value (it is unsatisfiable)")


def lower(schema: Any, *, approximate: bool = False) -> Any:
    """``schema`` rewritten into exactly equivalent forms the engines enforce (a new object;
    ``schema`` is untouched).

    ``approximate``: where ``not``, ``if`` or an overlapping ``oneOf`` has no exact form,
    write a sound subset instead: the result accepts only instances ``schema`` accepts, but
    not all of them (what is left out is logged). The engines compile this form: refusing
    the schema is the alternative, and constrained output that is always valid is the
    promise."""
    if not isinstance(schema, Mapping):
        return schema
    if not needs_lowering(schema):
        return schema  # (most schemas: one cheap walk instead of a copy and every step)
    return _lower_owned(_copy(dict(schema)), approximate=approximate, keys=None)


def _lower_owned(doc: dict[str, Any], *, approximate: bool, keys: _KeyHint | None) -> Any:
    """:func:`lower` on a schema the caller gives away (rewritten in place). ``keys``: what
    the schema's text says about its keywords (None: read from the schema)."""
    keys = keys or _KeyHint.of(doc)
    doc = _hoist_refs(doc, keys)
    lowerer = _Lowerer(doc, approximate=approximate, keys=keys)
    out = lowerer.run()
    for where in lowerer.approximated:
        _log.info("schema narrowed to a sound subset: %s", where)
    return out


#: Keywords some rewrite acts on: a schema without them (and without the forms
#: :func:`needs_lowering` also looks for) lowers to itself.
_ACTED_ON = frozenset(("$ref", "$id", "$anchor", "$dynamicAnchor", "$dynamicRef", "allOf", "anyOf",
                       "oneOf", "not", "if", "then", "else", "dependentRequired",
                       "dependentSchemas", "unevaluatedProperties", "unevaluatedItems",
                       "contains", "minContains", "maxContains", "propertyNames", "uniqueItems",
                       "$defs", "definitions", "dependencies", "patternProperties"))


def _plain_ref(node: Mapping[str, Any], root: Mapping[str, Any]) -> bool:
    """A ``$ref`` alone (annotations aside) to a root definition by a plain pointer: the
    engines resolve it as the lowering would (which only renames it)."""
    ref = node["$ref"]
    if not isinstance(ref, str) or set(node) - _ANNOTATIONS - {"$ref"}:
        return False
    for container in ("$defs", "definitions"):
        prefix = f"#/{container}/"
        name = ref[len(prefix):] if ref.startswith(prefix) else None
        if name is not None and not set(name) & set("/~%") and isinstance(
                root.get(container), Mapping) and isinstance(root[container].get(name),
                                                             (Mapping, bool)):
            return True
    return False


def _bare_any_of(node: Mapping[str, Any], root: Mapping[str, Any]) -> bool:
    """An ``anyOf`` of two or more schemas with nothing but annotations beside it: no step
    rewrites it (its branches are looked at on their own)."""
    branches = node["anyOf"]
    return (isinstance(branches, list) and len(branches) > 1
            and all(isinstance(b, Mapping) for b in branches)
            and not set(node) - _ANNOTATIONS - {"anyOf", "$defs", "definitions"})


def _definitions(node: Mapping[str, Any], root: Mapping[str, Any]) -> bool:
    """Definitions at the root: looked at entry by entry (references to them are checked
    where they are)."""
    return node is root


#: ``patternProperties`` names that every property name matches (ECMA-262 searches: each
#: matches the empty string at the start). Not ``^.*$``: ``.`` stops at a line break.
_EVERY_NAME = frozenset(("", ".*", "^", "^.*"))
#: ``patternProperties`` names that every property name matches but those that are empty or
#: hold a line break (the only names ``.`` cannot match); a sound subset reads them as
#: every name where other names are allowed anyway (:meth:`_Lowerer._names_all_matched`).
_ALMOST_EVERY_NAME = frozenset((".", ".+", "(.)+", "(.+)", "^.", "^.+", "^(.)+", "^(.+)",
                                "^.*$", "^(.*)$", "^.+$", "^(.+)$", "^(.)+$"))


def _no_name_for_all(node: Mapping[str, Any], root: Mapping[str, Any]) -> bool:
    """``patternProperties`` none of whose names matches every property name and none
    of whose subschemas allows anything: looked at as it is (the others:
    :meth:`_Lowerer._names_all_matched`)."""
    names = node["patternProperties"]
    return not (isinstance(names, Mapping) and (
        _EVERY_NAME.intersection(names) or _ALMOST_EVERY_NAME.intersection(names)
        or any(_allows_anything(sub) for sub in names.values())))


def _allows_anything(schema: Any) -> bool:
    """Whether ``schema`` is ``true``, or holds only annotations and keywords that
    constrain nothing with a ``true`` subschema (what they evaluate aside)."""
    return schema is True or isinstance(schema, Mapping) and all(
        k in _ANNOTATIONS or (k in _VACUOUS_WHEN_TRUE or k == "additionalItems")
        and v in (True, {}) for k, v in schema.items())


#: Keywords in :data:`_ACTED_ON` that need no lowering in the forms these accept.
_PASSIVE: dict[str, Callable[[Mapping[str, Any], Mapping[str, Any]], bool]] = {
    "$ref": _plain_ref, "anyOf": _bare_any_of, "$defs": _definitions,
    "definitions": _definitions, "patternProperties": _no_name_for_all}

#: The most declared properties :meth:`_Lowerer._names_all_matched` copies a subschema
#: into (each gets its own copy).
_MAX_COPIED = 32

# What each keyword asks of :func:`needs_lowering` (bit flags; 0: nothing).
_ACTIVE, _PASSIVE_KEY, _TYPED, _FAMILY_KEY, _COUNT, _ONE_SUB, _SUB_MAP, _SUB_LIST, _FORMAT = (
    1 << i for i in range(9))


def _role(key: str) -> int:
    return ((_ACTIVE if key in _ACTED_ON and key not in _PASSIVE else 0)
            | (_PASSIVE_KEY if key in _PASSIVE else 0)
            | (_TYPED if key in ("type", "enum", "const") else 0)
            | (_FAMILY_KEY if key in _FAMILY else 0) | (_COUNT if key in _COUNTS else 0)
            | (_ONE_SUB if key in _SUB else 0) | (_SUB_MAP if key in _MAPS else 0)
            | (_SUB_LIST if key in _LISTS else 0) | (_FORMAT if key == "format" else 0))


_ROLES = {k: r for k in {*_KEYWORDS, *_COUNTS} if (r := _role(k))}


def needs_lowering(schema: Mapping[str, Any]) -> bool:
    """Whether :func:`lower` can change ``schema``: a keyword some rewrite acts on, a count
    written as a float, a ``true``/``{}`` subschema, a format (a pattern takes its place),
    values beside other keywords, a required property that is ``false``, or keywords of one
    instance type without ``type`` (split per type). One look at each keyword of each
    subschema (most schemas: nothing to rewrite, every subschema looked at)."""
    roles = _ROLES
    stack: list[Any] = [schema]
    while stack:
        node = stack.pop()
        if not isinstance(node, Mapping):
            if node is False or node is True:
                continue
            return True  # not a schema: let the rewrites decide
        seen = 0
        for key, value in node.items():
            role = roles.get(key, 0)
            if not role:
                continue
            seen |= role
            if role & _ACTIVE:
                return True
            if role & _PASSIVE_KEY and not _PASSIVE[key](node, schema):
                return True
            if role & _COUNT and isinstance(value, float):
                return True
            if role & _ONE_SUB:
                if value is True or value == {}:
                    return True
                stack.append(value)  # (a draft-4 items list is not a schema: True)
            elif role & _SUB_MAP:
                if isinstance(value, Mapping):
                    stack.extend(value.values())
            elif role & _SUB_LIST:
                if isinstance(value, list):
                    stack.extend(value)
            elif role & _FORMAT and isinstance(value, str):
                return True  # a standard format becomes a pattern, a custom one goes
        if seen & _FAMILY_KEY and not seen & _TYPED:
            return True
        if ("enum" in node or "const" in node) and (
                node.keys() - _ANNOTATIONS - {"enum", "const", "type"} or _off_type(node)):
            return True  # the values the other keywords (or the type) reject are dropped
        if "required" in node and _requires_false(node, typed=False) or (
                node.get("enum") == []):
            return True
    return False


def _declared_types(node: Mapping[str, Any]) -> list[str] | None:
    """``node``'s ``type`` as a list of JSON Schema type names, None if absent or not one."""
    types = node.get("type")
    types = [types] if isinstance(types, str) else types
    if not isinstance(types, list) or not all(t in _TYPES or t == "integer" for t in types):
        return None
    return types


def _listed_values(node: Mapping[str, Any]) -> list[Any] | None:
    """``node``'s ``enum`` (or its ``const`` as a list), None if it has neither."""
    return node["enum"] if isinstance(node.get("enum"), list) else (
        [node["const"]] if "const" in node else None)


def _off_type(node: Mapping[str, Any]) -> bool:
    """Whether an ``enum``/``const`` value of ``node`` is not of its ``type``."""
    types = _declared_types(node)
    return types is not None and not all(has_type(v, types)
                                         for v in _listed_values(node) or [])


class _Lowerer:
    def __init__(self, doc: dict[str, Any], *, approximate: bool = False,
                 keys: _KeyHint | None = None) -> None:
        self.doc = doc
        self.approximate = approximate
        self.approximated: list[str] = []
        # Definitions are lowered once, whoever refers to them: with unevaluated* anywhere,
        # no rewrite that changes what a schema evaluates may run on any of them. (Asked
        # of the document as hoisted: unreachable definitions are gone.)
        unevaluated = ("unevaluatedProperties", "unevaluatedItems")
        self.annotations_matter = (keys is None or keys.may_hold(*unevaluated)) and (
            _KeyHint.of(doc).may_hold(*unevaluated))
        self.defs: dict[str, Any] = dict(doc.get("$defs") or {}) if isinstance(
            doc.get("$defs"), Mapping) else {}
        self._lowered: dict[str, Any] = {}
        # Targets whose lowering took a subset (theirs or an inlined target's).
        self._narrowed: set[str] = set()
        self._reused_narrowed = 0
        self._busy: set[str] = set()
        self._plain_defs: bool | None = None  # see _defs_resolvable
        self._acyclic: dict[str, bool] = {}  # see _not_recursive
        self._steps = self._step_table(self.annotations_matter)
        # keep: the schema being rewritten produces annotations an unevaluated* keyword
        # sees (its own or an enclosing one's); inherited: only an enclosing one's.
        self.keep = False
        self.inherited = False

    def run(self) -> Any:
        defs = self.doc.pop("$defs", None)
        root = self.node(self.doc)
        if isinstance(defs, Mapping):
            out_defs = {}
            narrowed = set()
            for name, sub in defs.items():
                if name not in self.defs:
                    out_defs[name] = sub
                    continue
                out_defs[name] = self.target(f"#/$defs/{name}")
                if self.approximate and f"{name}/{self.keep}/True" in self._narrowed:
                    with self._exact():
                        exact = self.target(f"#/$defs/{name}")
                    if json.dumps(exact) != json.dumps(out_defs[name]):
                        narrowed.add(name)
                        out_defs[f"{name}{_EXACT}"] = exact
            if narrowed:
                # A $ref left where a subset would be unsound (under not, if, oneOf,
                # contains) takes the exact form of its target.
                root = _retarget(root, narrowed, exact=False)
                out_defs = {n: _retarget(d, narrowed, exact=n.endswith(_EXACT))
                            for n, d in out_defs.items()}
                # Exact copies nothing reaches are dropped (unsound() would read them).
                reached, todo = set(), list(_refs(root))
                while todo:
                    name = todo.pop().rsplit("/", 1)[-1]
                    if name in out_defs and name not in reached:
                        reached.add(name)
                        todo += _refs(out_defs[name])
                out_defs = {n: d for n, d in out_defs.items()
                            if not n.endswith(_EXACT) or n in reached}
            if isinstance(root, dict):
                root["$defs"] = out_defs
        # Last, as a pass of its own: split schemas merge less well.
        return _map_bottom_up(root, self._finish)

    def _finish(self, s: dict[str, Any]) -> Any:
        if "type" in s or s.keys().isdisjoint(_FAMILY):
            return s  # (most schemas: the step does not apply)
        return self._split_types(s)

    @contextlib.contextmanager
    def _exact(self) -> Iterator[None]:
        """No subsets inside: a subschema that is negated (``not``, ``if``, a ``oneOf``
        branch, ``contains`` under ``maxContains``) must be exact, as the negation of a
        subset is a superset."""
        saved, self.approximate = self.approximate, False
        try:
            yield
        finally:
            self.approximate = saved

    def inline_exact(self, ref: str) -> Any:
        with self._exact():
            return self.inline(ref)

    # A ref target lowered once (None while it is being lowered: a recursive target).
    def target(self, ref: str) -> Any:
        name = ref.rsplit("/", 1)[-1]
        key = f"{name}/{self.keep}/{self.approximate}"
        if key in self._lowered:
            if key in self._narrowed:
                self._reused_narrowed += 1  # whoever inlines it is narrowed too
            return self._lowered[key]
        if key in self._busy:
            raise _NotExact("recursive $ref")
        self._busy.add(key)
        subsets = self._subsets()
        try:
            out = self.node(_copy(self.defs[name]), keep=self.keep)
        finally:
            self._busy.discard(key)
        if self._subsets() > subsets:
            self._narrowed.add(key)
        self._lowered[key] = out
        return out

    def _subsets(self) -> int:
        """How many subsets were taken so far (a count that only grows)."""
        return len(self.approximated) + self._reused_narrowed

    def inline(self, ref: str) -> Any:
        """The lowered target of ``ref`` if it is not recursive, else raise _NotExact. A
        target may keep references of its own where none of them leads back to a
        definition met on the way (the copy then means the same wherever it goes, and
        merging it with another schema ends: each merge unfolds a reference at most once
        per definition)."""
        if not self._is_def_ref(ref):
            raise _NotExact(f"unresolved $ref {ref}")
        target = self.target(ref)
        inner = list(_refs(target))
        if inner and not (self._defs_resolvable(inner) and self._not_recursive(ref)):
            raise _NotExact("a recursive $ref inside the target")
        return _copy(target)

    def _not_recursive(self, ref: str) -> bool:
        """Whether no chain of references from the definition ``ref`` names (as written)
        comes back to a definition already on the chain."""
        name = ref.rsplit("/", 1)[-1]
        known = self._acyclic.get(name)
        if known is not None:
            return known
        self._acyclic[name] = False  # (on the chain: meeting it again is a cycle)
        ok = all(self._is_def_ref(r) and self._not_recursive(r)
                 for r in set(_refs(self.defs[name])))
        self._acyclic[name] = ok
        return ok

    def node(self, s: Any, depth: int = 0, keep: bool = False) -> Any:
        """``s`` lowered, children first. ``keep``: ``s`` is an in-place applicator of a
        schema with ``unevaluated*`` keywords, which see the annotations ``s`` produces, so
        only rewrites that keep them (not ``not`` nor ``if``) may run."""
        if not isinstance(s, dict):
            return s
        inherited = keep
        keep = keep or "unevaluatedProperties" in s or "unevaluatedItems" in s
        if not _CHILD_KEYS.isdisjoint(s):
            self._children_lowered(s, depth, keep)
        hit = s.keys() & _STEP_KEYS
        if not hit or hit <= _PLAIN_VACUOUS_KEYS and _plain(s, hit):
            return s  # (most schemas in a document: no step changes them)
        saved = self.keep, self.inherited
        self.keep, self.inherited = keep, inherited
        try:
            return self.rewrite(s, depth)
        finally:
            self.keep, self.inherited = saved

    def _children_lowered(self, s: dict[str, Any], depth: int, keep: bool) -> None:
        node = self.node
        for key, sub in _child_keywords(s):
            keep_here = keep and key in _IN_PLACE
            if key in _MAPS:
                if key != "$defs" and isinstance(sub, dict):
                    s[key] = {k: node(v, depth, keep_here) for k, v in sub.items()}
                continue
            if isinstance(sub, list):
                if key not in _LIST_KEYS:
                    continue
            elif not isinstance(sub, dict) or key not in _SUB_KEYS:
                continue  # (true and false lower to themselves)
            if key == "propertyNames" and "type" not in sub:
                # Names are strings, so this is exact; an engine builds the names from this
                # schema, and a branch for other types let xgrammar write `{"aa": 1, 2: 3}`.
                sub = {**sub, "type": "string"}
            # What is negated is lowered exactly (as in `_exact`, without its cost here).
            exact = self.approximate and key in _NEGATED
            if exact:
                self.approximate = False
            try:
                s[key] = ([node(v, depth, keep_here) for v in sub] if isinstance(sub, list)
                          else node(sub, depth, keep_here))
            finally:
                if exact:
                    self.approximate = True

    def rewrite(self, s: dict[str, Any], depth: int = 0) -> Any:
        """Apply the steps in order; a step that builds a new schema (a merge brings
        keywords together that may need lowering again) restarts from its children."""
        if "unevaluatedProperties" in s or "unevaluatedItems" in s:
            steps = self._steps["keeping"]
        elif self.keep:
            steps = self._steps["kept"]
        else:
            steps = self._steps["all"]
        for step, acts_on in steps:
            if acts_on.isdisjoint(s):
                continue  # (each step leaves a schema without its keywords as it is)
            try:
                out = step(self, s)
            except _NotExact:
                continue
            if out is not s:
                # `out` may have lost its unevaluated* keywords: only an enclosing one's
                # annotations then matter.
                return self.node(out, depth + 1, self.inherited) if depth < 8 else out
        return s

    @staticmethod
    @functools.cache
    def _step_table(annotations_matter: bool) -> dict[str, tuple[tuple[
            Callable[[_Lowerer, dict[str, Any]], Any], frozenset[str]], ...]]:
        """The steps of :meth:`rewrite` in order, each with the keywords it acts on, for
        each context: ``keeping`` (beside ``unevaluated*``), ``kept`` (under an enclosing
        ``unevaluated*``) and ``all``."""
        cls = _Lowerer
        unevaluated = ("unevaluatedProperties", "unevaluatedItems")
        branches = ("anyOf", "oneOf")
        # What is "evaluated" depends on the applicators beside unevaluated*: only these
        # rewrites keep it (merging allOf and $ref targets into the schema).
        # A format becomes its pattern before the enum filter: the validator then decides
        # the values by our language, not by its own format checks.
        keeping = ((cls._drop_vacuous, _VACUOUS_KEYS | {"enum"}),
                   (cls._format_pattern, frozenset(("format",))),
                   (cls._enum_filter, frozenset(("enum", "const"))),
                   (cls._drop_false_branches, frozenset(branches)),
                   (cls._merge_all_of, frozenset(("allOf",))),
                   (cls._merge_ref, frozenset(("$ref",))),
                   (cls._unevaluated, frozenset(unevaluated)),
                   (cls._unevaluated_branches, frozenset(unevaluated)))
        rest = ((cls._not, frozenset(("not",))),
                (cls._if_then_else, frozenset(("if", "then", "else"))),
                (cls._dependent, frozenset(("dependentRequired", "dependentSchemas"))),
                (cls._distribute, frozenset(branches)),
                (cls._one_of_values, frozenset(("oneOf",))),
                (cls._one_of_by_type, frozenset(("oneOf",))),
                (cls._one_of_exclusive, frozenset(("oneOf",))),
                (cls._contains, frozenset(("contains",))),
                (cls._names_all_matched, frozenset(("patternProperties",))))
        # Subsets would change which properties and items count as evaluated.
        subsets = {cls._not, cls._if_then_else, cls._one_of_exclusive, cls._contains}
        # With unevaluated* anywhere, nothing that changes what a definition evaluates.
        dropped = {cls._one_of_exclusive, cls._contains, cls._enum_filter} if (
            annotations_matter) else set()
        table = {"keeping": keeping, "kept": tuple(st for st in (*keeping, *rest)
                                                   if st[0] not in subsets),
                 "all": (*keeping, *rest)}
        return {k: tuple(st for st in v if st[0] not in dropped) for k, v in table.items()}

    # -- steps (each returns the rewritten schema or raises _NotExact) -----------------------
    def _drop_vacuous(self, s: dict[str, Any]) -> Any:
        # A $defs entry is lowered once, outside any context: with unevaluated* anywhere,
        # a reference to it may be one that an unevaluated* keyword sees through.
        return _drop_vacuous(s, evaluated_matters=self.keep or self.annotations_matter)

    def _enum_filter(self, s: dict[str, Any]) -> Any:
        """``enum``/``const`` beside other keywords as the ``enum`` of the values that the
        whole schema accepts, decided by the ``jsonschema`` validator (formats asserted)
        when it is installed; a ``$ref`` inside is resolved in the document's definitions
        (:meth:`_defs_resolvable`; left alone otherwise)."""
        values = _listed_values(s)
        rest = set(s) - _ANNOTATIONS - {"enum", "const", "$defs", "type"}
        if values is None or self.keep:
            return s
        if not rest:
            return self._typed_values(s, values)
        refs = list(_refs(s))
        if refs and not self._defs_resolvable(refs):
            return s
        try:
            from jsonschema import Draft202012Validator as Validator
        except ImportError:
            return s
        types = s.get("type", [*_TYPES, "integer"])
        types = [types] if isinstance(types, str) else types
        if rest.isdisjoint(_KEYWORDS) and not ("enum" in s and "const" in s) and (
                isinstance(types, list) and types and all(
                    t in _TYPES or t == "integer" for t in types)):
            # Only unknown keywords (annotations) beside: the values of the types stay
            # (as the validator types them; most schemas that get here).
            kept = [v for v in values if any(
                Validator.TYPE_CHECKER.is_type(v, t) for t in types)]
            return {**{k: v for k, v in s.items() if k in _ANNOTATIONS},
                    "enum": kept} if kept else False
        # The values come from the enum: checking them against it again is quadratic.
        check = {k: v for k, v in s.items() if k not in _ANNOTATIONS and k != "enum"
                 and not (k == "const" and "enum" not in s)}
        fmt = s.get("format")
        if isinstance(fmt, str) and fmt in FORMATS and (
                fmt not in Validator.FORMAT_CHECKER.checkers or fmt in _LOOSE_CHECKS):
            # A format left (a subset where the schema is negated): the validator's check
            # is missing (its optional package is not installed) or looser than the format.
            raise _NotExact(f"the validator does not check format {fmt} strictly")
        if refs:  # every one a `#/$defs/pg<n>` (checked above): the definitions go along
            check["$defs"] = self.defs
        try:
            validator = Validator(check, format_checker=Validator.FORMAT_CHECKER)
            kept = [v for v in values if validator.is_valid(v)]
        except (KeyboardInterrupt, SystemExit):
            raise
        # A schema the validator cannot read; a `$ref` cycle that consumes nothing
        # (`{"if": {"$ref": "#"}}`) recurses until `referencing`'s Rust core panics
        # (pyo3's PanicException, a BaseException).
        except BaseException as exc:  # noqa: BLE001
            raise _NotExact(f"validator: {type(exc).__name__}") from None
        if not kept:
            return False
        return {**{k: v for k, v in s.items() if k in _ANNOTATIONS}, "enum": kept}

    @staticmethod
    def _typed_values(s: dict[str, Any], values: list[Any]) -> Any:
        """``enum``/``const`` beside ``type`` alone: the values of the type (``false`` if
        none is: ``{"type": "array", "enum": ["code"]}`` accepts nothing); ``s`` itself
        where every value is of the type."""
        types = _declared_types(s)
        if types is None:
            return s
        kept = [v for v in values if has_type(v, types)]
        if len(kept) == len(values):
            return s
        return {**{k: v for k, v in s.items() if k != "const"}, "enum": kept} if kept else False

    def _defs_resolvable(self, refs: list[str]) -> bool:
        """Whether a validator given ``self.defs`` as ``$defs`` resolves ``refs`` (and the
        references inside the definitions) as the schema does: every one a hoisted
        ``#/$defs/pg<n>`` and no ``$id`` (which would move the base URI) or dynamic reference
        in the definitions."""
        if self._plain_defs is None:
            text = json.dumps(self.defs)
            self._plain_defs = not any(f'"{k}"' in text for k in
                                       ("$id", "$dynamicRef", "$recursiveRef")) and all(
                map(self._is_def_ref, _refs(self.defs)))
        return self._plain_defs and all(map(self._is_def_ref, refs))

    def _is_def_ref(self, ref: str) -> bool:
        """Whether ``ref`` names one of the hoisted definitions (``#/$defs/pg<n>``)."""
        return ref.startswith("#/$defs/pg") and ref.rsplit("/", 1)[-1] in self.defs

    def _drop_false_branches(self, s: dict[str, Any]) -> Any:
        for key in ("anyOf", "oneOf"):
            if isinstance(s.get(key), list):
                branches = [b for b in s[key] if not self._empty(b, exact=key == "oneOf")]
                if not branches:
                    return False
                if len(branches) == 1:
                    rest = {k: v for k, v in s.items() if k != key}
                    return {**rest, "allOf": [*rest.get("allOf", []), branches[0]]}
                s[key] = branches
        return s

    def _empty(self, branch: Any, *, exact: bool) -> bool:
        """Whether ``branch`` is ``false``, or a ``$ref`` alone to a definition that lowers
        to ``false`` (``exact``: lowered exactly; a subset, narrowed to nothing, may only be
        left out of an ``anyOf``)."""
        if branch is False:
            return True
        if not isinstance(branch, Mapping) or set(branch) - _ANNOTATIONS != {"$ref"}:
            return False
        ref = branch["$ref"]
        if not isinstance(ref, str) or not self._is_def_ref(ref):
            return False
        with self._exact() if exact else contextlib.nullcontext():
            return self.target(ref) is False

    def _merge_all_of(self, s: dict[str, Any]) -> Any:
        parts = s.get("allOf")
        if not isinstance(parts, list):
            return s
        rest = {k: v for k, v in s.items() if k != "allOf"}
        out: Any = rest
        left = []
        for part in parts:
            try:
                out = merge(out, part, self.inline, host=True)
            except _NotExact:
                left.append(part)
            if out is False:
                return False
        if not isinstance(out, dict):
            return out
        if left:
            out["allOf"] = left
            if len(left) == len(parts):
                return s
        return out

    def _merge_ref(self, s: dict[str, Any]) -> Any:
        ref = s.get("$ref")
        if not isinstance(ref, str) or not set(s) - _ANNOTATIONS - {"$ref"}:
            return s
        target = self.inline(ref)
        rest = {k: v for k, v in s.items() if k != "$ref"}
        return merge(rest, target, self.inline, host=True)

    def _negate(self, s: Any, what: str) -> Any:
        try:
            return negate(s, self.inline_exact)
        except _NotExact as exc:
            if not self.approximate:
                raise
            self.approximated.append(f"{what} ({exc})")
            return negate(s, self.inline_exact, subset=True)

    def _not(self, s: dict[str, Any]) -> Any:
        if "not" not in s:
            return s
        negated = self._negate(s["not"], "not")
        rest = {k: v for k, v in s.items() if k != "not"}
        return merge(rest, negated, self.inline)

    def _if_then_else(self, s: dict[str, Any]) -> Any:
        if "if" not in s:
            for key in ("then", "else"):
                s.pop(key, None)  # ignored without "if"
            return s
        cond = s["if"]
        then = s.get("then", True)
        other = s.get("else", True)
        rest = {k: v for k, v in s.items() if k not in ("if", "then", "else")}
        if then is True:  # (if and true) or (not if and else) = if or else
            either: Any = True if other is True else {"anyOf": [cond, other]}
        else:
            yes = merge(cond, then, self.inline)
            no = self._negate(cond, "if")
            if other is not True:
                no = merge(no, other, self.inline)
            branches = [b for b in (yes, no) if b is not False]
            either = {"anyOf": branches} if branches else False
        return merge(rest, either, self.inline)

    def _dependent(self, s: dict[str, Any]) -> Any:
        out: Any = s
        for key in ("dependentRequired", "dependentSchemas"):
            deps = s.get(key)
            if not isinstance(deps, Mapping):
                continue
            rest = {k: v for k, v in out.items() if k != key}
            listed = rest.get("required")
            required: list[Any] = listed if isinstance(listed, list) else []
            if _types(rest) == {"object"} and any(n in required for n in deps):
                # A required property's dependency always applies: no branch needed.
                for name in [n for n in deps if n in required]:
                    need = deps[name]
                    rest = ({**rest, "required": list(dict.fromkeys([*rest.get(
                        "required", []), *need]))} if key == "dependentRequired"
                        else merge(rest, need, self.inline))
                    if not isinstance(rest, dict):
                        return rest
                left = {n: v for n, v in deps.items() if n not in required}
                return {**rest, key: left} if left else rest
            for name, need in deps.items():
                absent = {"properties": {name: False}}
                # Only objects holding `name` take the dependency: `need` on every other
                # instance would evaluate items or properties an unevaluated* keyword sees
                # (`items` of `need` on an array), though the `absent` branch keeps them valid.
                present: Any = ({"required": [name, *need]} if key == "dependentRequired"
                                else merge({"type": "object", "required": [name]}, need,
                                           self.inline))
                rest = merge(rest, {"anyOf": [absent, present]}, self.inline)
                if not isinstance(rest, dict):
                    return rest
            out = rest
        return out

    def _unevaluated(self, s: dict[str, Any]) -> Any:
        # `not` evaluates nothing, so it may stay beside (and be lowered afterwards).
        applicators = {"allOf", "anyOf", "oneOf", "$ref", "if", "then", "else",
                       "dependentSchemas", "$dynamicRef"}
        if "unevaluatedProperties" not in s and "unevaluatedItems" not in s:
            return s
        s = dict(s)  # a new schema: lowered again, now with every step
        if "unevaluatedProperties" in s:
            if applicators & set(s):
                raise _NotExact("applicators beside unevaluatedProperties")
            u = s.pop("unevaluatedProperties")
            if "additionalProperties" not in s:
                s["additionalProperties"] = u
        if "unevaluatedItems" in s:
            if applicators & set(s) or "contains" in s:
                raise _NotExact("applicators beside unevaluatedItems")
            u = s.pop("unevaluatedItems")
            if "items" not in s:
                s["items"] = u
        return s

    def _unevaluated_branches(self, s: dict[str, Any]) -> Any:
        """``unevaluated*`` beside ``oneOf``, ``if`` or ``anyOf``, as an ``anyOf`` with one
        branch per way the instance can be valid: the whole schema with that way's
        subschemas in ``allOf`` and the ways that must fail under ``not`` (which evaluates
        nothing). Exactly one way holds for ``oneOf`` (branch i and not the others) and for
        ``if`` (if and then, or not if and else), so each branch's ``unevaluated*`` sees
        what the original saw and may then become ``additionalProperties``/``items``. An
        ``anyOf`` evaluates the union of every branch that holds: exact when its branches
        are disjoint; otherwise, with ``approximate``, each branch alone (a subset)."""
        if "unevaluatedProperties" not in s and "unevaluatedItems" not in s:
            return s
        key = next((k for k in ("oneOf", "if", "anyOf") if k in s), None)
        if key is None:
            return s
        taken = {key, "not", *(("then", "else") if key == "if" else ())}
        rest = {k: v for k, v in s.items() if k not in taken}
        ways: list[tuple[list[Any], list[Any]]]  # (must hold, must fail)
        if key == "if":
            ways = [([s["if"], s.get("then", True)], []), ([s.get("else", True)], [s["if"]])]
        else:
            options = s[key]
            if not isinstance(options, list) or not options:
                raise _NotExact(f"{key} is not a list")
            if key == "oneOf":
                ways = [([b], options[:i] + options[i + 1:]) for i, b in enumerate(options)]
            else:
                if not _pairwise_disjoint(options, self.defs):
                    if not self.approximate:
                        raise _NotExact("anyOf branches may overlap beside unevaluated*")
                    self.approximated.append("anyOf beside unevaluated*: each branch alone")
                ways = [([b], []) for b in options]
        branches = []
        for hold, fail in ways:
            if "not" in s:
                fail = [s["not"], *fail]
            branch = {**_copy(rest),
                      "allOf": [*_copy(rest.get("allOf", [])), *_copy(hold)]}
            if fail:
                branch["allOf"].append(
                    {"not": _copy(fail[0] if len(fail) == 1 else {"anyOf": fail})})
            branches.append(branch)
        return {"anyOf": branches}

    def _split_types(self, s: dict[str, Any]) -> Any:
        """A schema without ``type`` whose keywords constrain some instance types: one
        ``anyOf`` branch per type (the other types pass unconstrained)."""
        if "type" in s or "enum" in s or "const" in s:
            return s
        families = {_FAMILY[k] for k in s if k in _FAMILY}
        unknown = {k for k in s if k not in _KEYWORDS}  # annotations (2019-09 on), ignored before
        if not families or set(s) - _ANNOTATIONS - set(_FAMILY) - {"$defs"} - unknown:
            return s
        free = [t for t in _TYPES if t not in families and not (
            t == "integer" and "number" in families)]
        branches: list[Any] = []
        if free:
            branches.append({"type": free if len(free) > 1 else free[0]})
        for fam in sorted(families):
            branches.append({"type": fam, **{k: v for k, v in s.items() if _FAMILY.get(k) == fam}})
        keep = {k: v for k, v in s.items() if k in _ANNOTATIONS or k == "$defs"}
        return {**keep, "anyOf": branches}

    def _one_of_values(self, s: dict[str, Any]) -> Any:
        """A ``oneOf`` whose branches only list values (``enum`` or ``const``, with a
        ``type`` that keeps some of them; ``false`` lists none) as the ``enum`` of the values
        exactly one branch accepts (JSON equality: 1 and 1.0 are one value)."""
        branches = s.get("oneOf")
        if not isinstance(branches, list) or not branches:
            return s
        listed: list[list[Any]] = []
        for b in branches:
            if b is False:
                continue
            if not isinstance(b, dict) or len(b.keys() - _ANNOTATIONS - {"type"}) != 1:
                return s
            if isinstance(b.get("enum"), list):
                values = b["enum"]
            elif "const" in b:
                values = [b["const"]]
            else:
                return s
            types = _types(b)
            listed.append(values if types is None else [v for v in values
                                                        if _has_type(v, types)])
        branch_count: dict[str, int] = {}
        first: dict[str, Any] = {}
        for values in listed:
            distinct: dict[str, Any] = {}  # (a value listed twice in a branch counts once)
            for v in values:
                distinct.setdefault(_key(v), v)
            for key, v in distinct.items():
                branch_count[key] = branch_count.get(key, 0) + 1
                first.setdefault(key, v)
        kept = [v for k, v in first.items() if branch_count[k] == 1]
        if not kept:
            return False
        return {**{k: v for k, v in s.items() if k != "oneOf"}, "enum": kept}

    def _one_of_by_type(self, s: dict[str, Any]) -> Any:
        """A ``oneOf`` whose branches may overlap, taken one instance type at a time: on a
        type where the branches left are disjoint it stays; where two or more branches
        accept every value of the type, no value of it is valid; otherwise not exact."""
        branches = s.get("oneOf")
        if not isinstance(branches, list) or len(branches) < 2 or (
                set(s) - _ANNOTATIONS - {"oneOf", "$defs"}):
            return s
        if _pairwise_disjoint(branches, self.defs):
            return s
        parts = []
        for t in _TYPES:
            # Exact targets: a branch narrowed to nothing on a type would let the others
            # take values it also accepts (exactly one must).
            live = [m for m in (_only_type(merge(b, {"type": t}, self.inline_exact), t)
                                for b in branches) if m is not False]
            if len(live) == 1:
                parts.append(live[0])
            elif len(live) > 1:
                if _pairwise_disjoint(live, self.defs):
                    parts.append({"oneOf": live})
                elif sum(set(m) - _ANNOTATIONS == {"type"} and m["type"] == t
                         for m in live) < 2:
                    raise _NotExact(f"oneOf branches overlap on {t}")
        keep = {k: v for k, v in s.items() if k != "oneOf"}
        if not parts:
            return False
        return {**keep, "anyOf": parts} if len(parts) > 1 else merge(keep, parts[0],
                                                                       self.inline)

    def _one_of_exclusive(self, s: dict[str, Any]) -> Any:
        """A ``oneOf`` whose branches may overlap as ``anyOf`` of exclusive branches: branch
        ``i`` and the negation of every other (exact where the negations are; otherwise,
        with ``approximate``, a sound subset that drops the parts of a negation that cannot
        be written, then whole alternatives where the product grows past MAX_BRANCHES)."""
        branches = s.get("oneOf")
        if not isinstance(branches, list) or len(branches) < 2 or (
                set(s) - _ANNOTATIONS - {"oneOf", "$defs"}):
            return s
        if _pairwise_disjoint(branches, self.defs):
            if not self.approximate:
                return s
            # The branches (lowered exactly) never overlap: anyOf, whose branches are
            # positive and may then be narrowed.
            return {**{k: v for k, v in s.items() if k != "oneOf"}, "anyOf": branches}
        exact = True
        out = []
        for i, b in enumerate(branches):
            acc: Any = b
            for j, other in enumerate(branches):
                if j == i or acc is False:
                    continue
                try:
                    neg = negate(other, self.inline_exact)
                except _NotExact:
                    if not self.approximate:
                        raise
                    exact = False
                    # Names b declares help say how an object falls outside `other`.
                    neg = negate(other, self.inline_exact, subset=True,
                                 names=_declared(b))
                try:
                    acc = merge(acc, neg, self.inline)
                except _NotExact:
                    if not self.approximate:
                        raise
                    exact = False
                    acc = _merge_some(acc, neg, self.inline)
            if acc is not False:
                out.append(acc)
        if not exact:
            self.approximated.append(f"oneOf of {len(branches)} overlapping branches")
        keep = {k: v for k, v in s.items() if k != "oneOf"}
        if not out:
            return False
        return {**keep, "anyOf": out} if len(out) > 1 else merge(keep, out[0], self.inline)

    def _contains(self, s: dict[str, Any]) -> Any:
        """``contains`` (with ``minContains`` m, default 1, and ``maxContains`` M), with
        ``approximate``, as the sound subset of arrays whose m matches come first, right
        after ``prefixItems``: those positions get ``items`` and ``contains`` merged, and
        with M the later items must not match (a subset of the negation where it cannot be
        written). Arrays whose matches lie elsewhere are left out."""
        if "contains" not in s or not self.approximate:
            return s
        if "unevaluatedItems" in s or self.keep:
            raise _NotExact("contains evaluates items for unevaluatedItems")
        least, most = s.get("minContains", 1), s.get("maxContains")
        prefix = s.get("prefixItems") or []
        items = s.get("items", True)
        if not isinstance(least, int) or not (most is None or isinstance(most, int)) or (
                not isinstance(prefix, list) or isinstance(items, list)):
            raise _NotExact("contains with draft-4 items or non-integer counts")
        rest = {k: v for k, v in s.items() if k not in ("contains", "minContains",
                                                         "maxContains")}
        if most is not None and most < least:
            return merge(rest, _NO_ARRAY, self.inline)  # no array can hold the matches
        match = merge(items, s["contains"], self.inline)
        if least > 0 and match is False:
            return merge(rest, _NO_ARRAY, self.inline)
        if least > 0:
            rest["prefixItems"] = [*prefix, *([match] * least)]
            rest["minItems"] = max(rest.get("minItems", 0), len(prefix) + least)
        if most is not None:
            # No other position may match: the prefix's own and the later items.
            other = self._negate(s["contains"], "maxContains")
            rest["prefixItems"] = [merge(p, other, self.inline) for p in prefix] + (
                rest.get("prefixItems", [])[len(prefix):])
            rest["items"] = merge(items, other, self.inline)
        self.approximated.append("contains: the matching items first")
        return rest

    def _format_pattern(self, s: dict[str, Any]) -> Any:
        """A standard ``format`` as the ``pattern`` of its language
        (``json_schema.formats.FORMATS``), so that every engine enforces our language and
        none its own format code: always where the language is exact, with ``approximate``
        where it is a sound subset (a negated subset would be a superset: the ``format``
        stays there, and the engines refuse it). Both keywords apply to strings only. A
        format whose values all have one length decides ``minLength``/``maxLength`` here;
        beside another ``pattern`` the format's goes into an ``allOf`` (both must match)."""
        fmt = s.get("format")
        entry = FORMATS.get(fmt) if isinstance(fmt, str) else None
        if entry is None or entry.pattern is None or not (entry.exact or self.approximate):
            return s
        if not entry.exact:
            self.approximated.append(f"format {fmt} without {entry.left_out}")
        out = {k: v for k, v in s.items() if k != "format"}
        if entry.length is not None and ("minLength" in out or "maxLength" in out):
            low, high = out.pop("minLength", 0), out.pop("maxLength", entry.length)
            if not (isinstance(low, (int, float)) and isinstance(high, (int, float))):
                raise _NotExact("length bounds that are not numbers")
            if not low <= entry.length <= high:
                # No string of the format has a length within the bounds.
                types = _types(out)
                rest = (types if types is not None else {*_TYPES, "integer"}) - {"string"}
                if not rest:
                    return False
                return {k: v for k, v in out.items() if k not in _STRING_KW} | {
                    "type": _type_list(rest)}
        if isinstance(out.get("pattern"), str) and out["pattern"] != entry.pattern:
            out["allOf"] = [*out.get("allOf", []), {"pattern": entry.pattern}]
        else:
            out["pattern"] = entry.pattern
        return out

    def _names_all_matched(self, s: dict[str, Any]) -> Any:
        """``patternProperties`` of one name that every property name matches (``.*``):
        each declared property's value must also match its subschema, and no name is
        additional, so it becomes ``additionalProperties`` and an ``allOf`` in each declared
        property. The engines then build a plain open object (xgrammar refuses
        ``patternProperties`` beside other names; llguidance walks its token trie at each
        such name).

        A sound subset where a schema allows other names anyway (``additionalProperties``
        absent or true) and its one name is matched by every name but those that are
        empty or hold a line break (``^.+``, ``^.*$``, ...): those few names take the
        subschema too."""
        names, props = s["patternProperties"], s.get("properties", {})
        others_allowed = s.get("additionalProperties", True) in (True, {})
        if isinstance(names, Mapping) and others_allowed and (
                not self.annotations_matter and not self.keep):
            # Where every other name is allowed anyway, a name whose subschema allows
            # anything changes nothing (Github_medium o16744: `^x_` extensions).
            kept = {n: sub for n, sub in names.items() if not _allows_anything(sub)}
            if len(kept) < len(names):
                s = {k: v for k, v in s.items() if k != "patternProperties"}
                if not kept:
                    return s
                s["patternProperties"] = names = kept
        if not isinstance(names, Mapping) or len(names) != 1 or not isinstance(props, Mapping):
            return s
        ((name, sub),) = names.items()
        if name not in _EVERY_NAME:
            if name not in _ALMOST_EVERY_NAME or not self.approximate or not others_allowed:
                return s
            self.approximated.append(f"patternProperties {name!r}: names that are empty or "
                                     "hold a line break take its subschema too")
        vacuous = sub is True or sub == {}
        if not vacuous and len(props) > _MAX_COPIED:
            raise _NotExact(f"{len(props)} properties to copy a subschema into")
        out = {k: v for k, v in s.items() if k != "patternProperties"}
        if props and not vacuous:
            out["properties"] = {n: {"allOf": [_copy(p), _copy(sub)]} for n, p in props.items()}
        out["additionalProperties"] = _copy(sub)
        return out

    def _distribute(self, s: dict[str, Any]) -> Any:
        """``anyOf``/``oneOf`` beside other keywords: the keywords merged into each branch
        (conjunction distributes over both; a branch that becomes ``false`` is dropped)."""
        for key in ("anyOf", "oneOf"):
            branches = s.get(key)
            if not isinstance(branches, list):
                continue
            rest = {k: v for k, v in s.items() if k != key}
            if not set(rest) - _ANNOTATIONS - {"$defs"}:
                continue
            if len(branches) > MAX_BRANCHES:
                raise _NotExact("too many branches")
            keep = {k: v for k, v in rest.items() if k in _ANNOTATIONS or k == "$defs"}
            body = {k: v for k, v in rest.items() if k not in keep}
            # A oneOf branch counts against the others: only exact targets inlined there.
            inline = self.inline_exact if key == "oneOf" else self.inline
            merged = [merge(body, b, inline) for b in branches]
            return {**keep, key: merged}
        return s


#: Every instance but arrays.
_NO_ARRAY = {"type": [t for t in _TYPES if t != "array"]}

#: Subschema keywords that constrain nothing when their value is ``true`` (or ``{}``).
_VACUOUS_WHEN_TRUE = ("additionalProperties", "items", "propertyNames", "unevaluatedProperties",
                      "unevaluatedItems")

#: Keywords of :data:`_VACUOUS_KEYS` that :func:`_drop_vacuous` changes only when a
#: ``required`` property is ``false``, a count is a float or a format is not standard.
_PLAIN_VACUOUS_KEYS = frozenset(("required", "format", "minLength", "maxLength", "minItems",
                                 "maxItems", "minProperties", "maxProperties"))
_VACUOUS_KEYS = frozenset((*_COUNTS, *_VACUOUS_WHEN_TRUE, "uniqueItems", "not", "propertyNames",
                           "dependentSchemas", "dependentRequired", "contains", "format",
                           "dependencies", "required"))


def _changed(out: Any, s: Any) -> Any:
    """``out`` if it differs from ``s`` as JSON (``2.0`` vs ``2`` included), else ``s``: a
    step that returns ``s`` itself made no rewrite."""
    if out != s:
        return out
    # Equal values that differ as JSON: a count written 2.0 that became 2.
    floats = isinstance(s, dict) and any(isinstance(s.get(k), float) for k in _COUNTS)
    return out if floats and json.dumps(out) != json.dumps(s) else s


def _plain(s: dict[str, Any], hit: set[str]) -> bool:
    """Whether no step changes ``s``, whose keywords of :data:`_STEP_KEYS` are ``hit``, all
    in :data:`_PLAIN_VACUOUS_KEYS` (most schemas: ``required`` properties that may be
    present, integer counts, no format: a pattern takes the place of a format)."""
    return not any(isinstance(s[k], float) for k in hit) and (
        "format" not in s) and not _requires_false(s)


def _drop_vacuous(s: dict[str, Any], *, evaluated_matters: bool = False) -> Any:
    """Keywords that constrain nothing or have a plainer equal form: counts written as
    floats (``2.0``), ``true`` subschemas, ``uniqueItems: false``, ``propertyNames: false``
    (no property at all), ``contains`` of ``true``/``false`` or with ``minContains: 0``,
    ``minContains``/``maxContains`` without ``contains``. ``evaluated_matters``: an
    ``unevaluated*`` keyword sees what ``s`` evaluates, so ``true`` subschemas that
    evaluate everything (``items``, ``additionalProperties``, ``unevaluated*``) stay."""
    if s.get("enum") == []:
        return False  # no value is among none
    hit = s.keys() & _VACUOUS_KEYS
    if not hit:
        return s
    if _requires_false(s):
        return False
    if hit <= _PLAIN_VACUOUS_KEYS and _plain(s, hit):
        return s
    out = dict(s)
    fmt = out.get("format")
    if isinstance(fmt, str) and fmt not in STANDARD_FORMATS:
        del out["format"]  # a custom format: an annotation
    deps = out.get("dependencies")
    if isinstance(deps, Mapping) and "dependentRequired" not in out and (
            "dependentSchemas" not in out):
        # The draft 4-7 keyword, split as 2019-09 did.
        del out["dependencies"]
        required = {n: v for n, v in deps.items() if isinstance(v, list)}
        schemas = {n: v for n, v in deps.items() if not isinstance(v, list)}
        if required:
            out["dependentRequired"] = required
        if schemas:
            out["dependentSchemas"] = schemas
    for k in _COUNTS:
        v = out.get(k)
        if isinstance(v, float) and v.is_integer():
            out[k] = int(v)
    # `items: true` beside `unevaluatedItems` evaluates every item: it must stay.
    unevaluated = evaluated_matters or "unevaluatedProperties" in out or "unevaluatedItems" in out
    for k in _VACUOUS_WHEN_TRUE:
        if k in out and (out[k] is True or out[k] == {}) and not (
                unevaluated and k != "propertyNames"):
            del out[k]
    if out.get("uniqueItems") is False:
        del out["uniqueItems"]
    if out.get("not") is False:
        del out["not"]
    if out.get("propertyNames") is False:
        del out["propertyNames"]
        out["maxProperties"] = 0
    for k in ("dependentSchemas", "dependentRequired"):
        if isinstance(out.get(k), Mapping):
            kept = {n: v for n, v in out[k].items() if v is not True and v != {} and v != []}
            if kept:
                out[k] = kept
            else:
                del out[k]
    if unevaluated:
        pass  # `contains` evaluates the items it matches
    elif "contains" not in out:
        out.pop("minContains", None)
        out.pop("maxContains", None)
    else:
        least = out.get("minContains", 1)
        most = out.get("maxContains")
        if not isinstance(least, int) or not (most is None or isinstance(most, int)):
            return _changed(out, s)
        if least == 0 and most is None:
            for k in ("contains", "minContains"):
                out.pop(k, None)
        elif out["contains"] is True or out["contains"] == {}:
            # Every item matches: the counts bound the length.
            for k in ("contains", "minContains", "maxContains"):
                out.pop(k, None)
            out["minItems"] = max(out.get("minItems", 0), least)
            if most is not None:
                out["maxItems"] = min(out.get("maxItems", most), most)
        elif out["contains"] is False:
            for k in ("contains", "minContains", "maxContains"):
                out.pop(k, None)
            if least > 0:  # no array can hold a match
                out = merge(out, _NO_ARRAY, _no_inline)
    return _changed(out, s)


#: Keywords whose subschemas are negated by some rewrite (lowered exactly).
_NEGATED = frozenset(("not", "if", "oneOf", "contains"))

#: Keywords some step of ``_Lowerer.rewrite`` acts on: a schema without any is left as it is.
_STEP_KEYS = frozenset((*_VACUOUS_KEYS, "enum", "const", "anyOf", "oneOf", "allOf", "$ref",
                        "unevaluatedProperties", "unevaluatedItems", "not", "if", "then",
                        "else", "dependentRequired", "dependentSchemas", "contains",
                        "format", "patternProperties"))

#: Suffix of the exact form of a ``$defs`` entry whose lowering was narrowed.
_EXACT = "_exact"


def _retarget(s: Any, narrowed: set[str], *, exact: bool) -> Any:
    """``s`` with every ``$ref`` to a narrowed definition in a negated position (or
    anywhere, with ``exact``) pointing at the definition's exact form."""
    if not isinstance(s, dict):
        return s
    ref = s.get("$ref")
    if exact and isinstance(ref, str) and ref.startswith("#/$defs/") and (
            ref[len("#/$defs/"):] in narrowed):
        s = {**s, "$ref": f"{ref}{_EXACT}"}
    out = dict(s)
    for key in _SUB:
        if key in s and isinstance(s[key], Mapping):
            out[key] = _retarget(s[key], narrowed, exact=exact or key in _NEGATED)
    for key in _MAPS:
        if key != "$defs" and isinstance(s.get(key), Mapping):
            out[key] = {k: _retarget(v, narrowed, exact=exact) for k, v in s[key].items()}
    for key in (*_LISTS, "items"):
        if isinstance(s.get(key), list):
            out[key] = [_retarget(v, narrowed, exact=exact or key in _NEGATED) for v in s[key]]
    return out


#: RFC 3339 full-date, calendar exact (days per month, leap years), years 0001-9999: both
#: engines' own ``date`` accepts 2023-02-29, and xgrammar's 2022-02-30 too.
DATE_PATTERN = FORMATS["date"].pattern
