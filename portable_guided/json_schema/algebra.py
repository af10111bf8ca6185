"""The algebra of schemas the lowering and the soundness checks rest on: conjunction
(:func:`merge`), complement (:func:`negate`), a sufficient test that two schemas share no
instance (:func:`disjoint`), and the instance types a schema can accept (:func:`value_types`).
A form with no keyword-level answer raises ``_NotExact`` (the caller keeps the keyword)."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Any

from .keywords import _ANNOTATIONS, _FAMILY, _KEYWORDS, _TYPES
from .values import _copy, _key, _same, has_type

__all__ = ["merge", "negate", "value_types", "disjoint", "merge_type"]


class _NotExact(Exception):
    """A rewrite that would not be exact for this schema (the keyword stays)."""


#: Largest number of branches a distribution of anyOf/oneOf may produce.
MAX_BRANCHES = 16


def _requires_false(s: Mapping[str, Any], *, typed: bool = True) -> bool:
    """``s`` requires a property whose schema is ``false``: no object is valid, and with
    ``typed`` (``s`` accepts objects only) no instance at all."""
    props, required = s.get("properties"), s.get("required")
    return (isinstance(props, Mapping) and isinstance(required, list)
            and (not typed or _types(s) == {"object"})
            and any(props.get(n) is False for n in required if isinstance(n, str)))


def _types(s: Mapping[str, Any]) -> set[str] | None:
    t = s.get("type")
    if t is None:
        return None
    ts = {t} if isinstance(t, str) else set(t)
    return ts


def _type_list(ts: set[str]) -> Any:
    order = [t for t in ("null", "boolean", "object", "array", "string", "number", "integer")
             if t in ts]
    return order[0] if len(order) == 1 else order


def _meet_types(a: set[str], b: set[str]) -> set[str]:
    out = a & b
    if "integer" in a and "number" in b or "number" in a and "integer" in b:
        out.add("integer")
    if "integer" in out and "number" in out:
        out.discard("integer")
    return out


_has_type = has_type
_MAX = ("maximum", "maxLength", "maxItems", "maxProperties", "maxContains")
_MIN = ("minimum", "minLength", "minItems", "minProperties", "minContains")


def merge(a: Any, b: Any, inline: Any, *, host: bool = False) -> Any:
    """The conjunction of schemas ``a`` and ``b`` as one schema; raises _NotExact where it
    cannot be written keyword by keyword. ``host``: ``b`` is an in-place applicator of ``a``
    (an ``allOf`` branch, a ``$ref`` target), so ``a``'s ``unevaluated*`` keywords see what
    ``b`` evaluates and may stay."""
    for side in ((b,) if host else (a, b)):
        if isinstance(side, Mapping) and ("unevaluatedProperties" in side
                                          or "unevaluatedItems" in side):
            raise _NotExact("unevaluated* would see other keywords")
    if a is True or a == {}:
        return _copy(b)
    if b is True or b == {}:
        return _copy(a)
    if a is False or b is False:
        return False
    if not isinstance(a, Mapping) or not isinstance(b, Mapping):
        raise _NotExact("not a schema")
    a, b = _copy(dict(a)), _copy(dict(b))
    if "$ref" in a:
        return merge(merge(a, inline(a.pop("$ref")), inline), b, inline)
    if "$ref" in b:
        return merge(a, merge(b, inline(b.pop("$ref")), inline), inline)
    if a.get("allOf") or b.get("allOf"):
        raise _NotExact("nested allOf")
    for one, other in ((a, b), (b, a)):
        if one.get("patternProperties") and other.get("additionalProperties", True) is not True \
                and _key(one["patternProperties"]) != _key(other.get("patternProperties")):
            raise _NotExact("patternProperties beside the other side's additionalProperties")
    out: dict[str, Any] = {}
    keys = list(a) + [k for k in b if k not in a]
    for k in keys:
        if k not in b:
            out[k] = a[k]
        elif k not in a:
            out[k] = b[k]
        else:
            out[k] = _merge_key(k, a, b, inline)
    # Properties one side declares are constrained on the other side by its
    # patternProperties / additionalProperties.
    for one, other in ((a, b), (b, a)):
        mine = one.get("properties") or {}
        theirs = other.get("properties") or {}
        for name in mine:
            if name in theirs:
                continue
            if other.get("patternProperties"):
                raise _NotExact("patternProperties beside properties of the other side")
            extra = other.get("additionalProperties", True)
            if extra is not True:
                out["properties"][name] = merge(out["properties"][name], extra, inline)
    for one, other in ((a, b), (b, a)):
        if isinstance(one.get("prefixItems"), list):
            theirs_n = len(other.get("prefixItems") or [])
            if theirs_n < len(one["prefixItems"]) and other.get("items", True) is not True:
                # positions past the other's prefix are constrained by its items
                for i in range(theirs_n, len(one["prefixItems"])):
                    out["prefixItems"][i] = merge(out["prefixItems"][i], other["items"], inline)
    if out.get("enum") == []:
        return False
    if _requires_false(out):
        return False
    if "type" in out:
        types = _types(out) or set()
        if not types:
            return False
        for key in ("enum", "const"):
            if key in out:
                values = out[key] if key == "enum" else [out[key]]
                if not any(_has_type(v, types) for v in values):
                    return False
    return out


def _merge_key(k: str, a: Mapping[str, Any], b: Mapping[str, Any], inline: Any) -> Any:
    x, y = a[k], b[k]
    if k in _ANNOTATIONS or k == "$defs" or k not in _KEYWORDS:
        return x  # (an unknown keyword is an annotation: it constrains nothing)
    if _same(x, y) and k not in ("properties", "prefixItems"):
        return x
    if k == "type":
        ts = _meet_types(_types(a) or set(), _types(b) or set())
        return _type_list(ts) if ts else []
    if k in _MAX:
        return min(x, y)
    if k in _MIN:
        return max(x, y)
    if k == "exclusiveMaximum":
        return min(x, y)
    if k == "exclusiveMinimum":
        return max(x, y)
    if k == "required":
        return list(dict.fromkeys([*x, *y]))
    if k == "enum":
        keys = {_key(v) for v in y}
        return [v for v in x if _key(v) in keys]
    if k == "const":
        raise _NotExact("two different consts")  # equal consts returned above
    if k == "uniqueItems":
        return bool(x or y)
    if k == "multipleOf" and isinstance(x, int) and isinstance(y, int):
        return x * y // math.gcd(x, y)
    if k == "properties":
        out = dict(x)
        for name, sub in y.items():
            out[name] = merge(out[name], sub, inline) if name in out else sub
        return out
    if k in ("additionalProperties", "items", "propertyNames"):
        if isinstance(x, list) or isinstance(y, list):
            raise _NotExact("draft-4 items")
        return merge(x, y, inline)
    if k in ("anyOf", "oneOf"):
        # (x1 or x2) and (y1 or y2) = (x1 and y1) or (x1 and y2) or ...; for oneOf the
        # pairs valid number count_x * count_y, which is 1 exactly when both counts are.
        if len(x) * len(y) > MAX_BRANCHES:
            raise _NotExact("too many branches")
        pairs = [merge(bx, by, inline) for bx in x for by in y]
        return [p for p in pairs if p is not False] or [False]
    if k == "prefixItems":
        n = max(len(x), len(y))
        return [merge(x[i] if i < len(x) else True, y[i] if i < len(y) else True, inline)
                for i in range(n)]
    if k == "dependentRequired":
        out = {n: list(v) for n, v in x.items()}
        for n, v in y.items():
            out[n] = list(dict.fromkeys([*out.get(n, []), *v]))
        return out
    raise _NotExact(f"{k} on both sides")


_NEG_BOUND = {"minimum": ("exclusiveMaximum", "number"), "maximum": ("exclusiveMinimum", "number"),
              "exclusiveMinimum": ("maximum", "number"), "exclusiveMaximum": ("minimum", "number")}
_NEG_COUNT = {"minLength": ("maxLength", "string", -1), "maxLength": ("minLength", "string", 1),
              "minItems": ("maxItems", "array", -1), "maxItems": ("minItems", "array", 1),
              "minProperties": ("maxProperties", "object", -1),
              "maxProperties": ("minProperties", "object", 1)}


def negate(s: Any, inline: Any, *, subset: bool = False, names: tuple[str, ...] = ()) -> Any:
    """A schema accepting exactly the instances ``s`` rejects; raises _NotExact for forms
    without a keyword-level complement. ``subset``: where a part of the complement cannot be
    written, leave it out (the result then accepts only instances ``s`` rejects, but not all
    of them); ``names``: property names whose presence violates ``additionalProperties:
    false`` where ``s`` does not declare them (a part of that complement)."""
    if s is True or s == {}:
        return False
    if s is False:
        return True
    if not isinstance(s, Mapping):
        raise _NotExact("not a schema")
    s = {k: v for k, v in s.items() if k not in _ANNOTATIONS and k != "$defs"}
    if "$ref" in s:
        try:
            target = inline(s.pop("$ref"))
        except _NotExact:
            if not subset:
                raise
            return False  # a recursive target: no part of its complement is written
        return negate(merge(s, target, inline), inline, subset=subset, names=names)
    parts: list[Any] = []  # the instance is rejected iff one of these holds
    for k, v in s.items():
        try:
            parts += _negated_keyword(k, v, s, inline, subset)
        except _NotExact:
            if not subset:
                raise
            if k == "additionalProperties" and v is False and not s.get("patternProperties"):
                declared = s.get("properties") or {}
                parts += [{"type": "object", "required": [n]} for n in names
                          if n not in declared]
    parts = [p for p in parts if p is not False]
    if not parts:
        return False
    return parts[0] if len(parts) == 1 else {"anyOf": parts}


def _merge_some(acc: Any, neg: Any, inline: Any) -> Any:
    """``acc`` and one alternative of ``neg`` (the first, simplest first, that merges into
    something satisfiable): a subset of ``acc`` and ``neg``."""
    options = neg["anyOf"] if isinstance(neg, dict) and set(neg) == {"anyOf"} else [neg]
    for option in sorted(options, key=lambda o: len(json.dumps(o))):
        try:
            out = merge(acc, option, inline)
        except _NotExact:
            continue
        if out is not False:
            return out
    return False


def _declared(s: Any) -> tuple[str, ...]:
    """The property names ``s`` declares or requires."""
    if not isinstance(s, Mapping):
        return ()
    props, req = s.get("properties"), s.get("required")
    names = [*(props if isinstance(props, Mapping) else ()),
             *(n for n in (req if isinstance(req, list) else ()) if isinstance(n, str))]
    return tuple(dict.fromkeys(names))


def _negated_keyword(k: str, v: Any, s: Mapping[str, Any], inline: Any,
                     subset: bool) -> list[Any]:
    """Schemas whose union is the set of instances keyword ``k: v`` of ``s`` rejects."""
    if k == "type":
        ts = _types(s) or set()
        if "integer" in ts and "number" not in ts and not subset:
            raise _NotExact("not integer")  # fractions have no type of their own
        # (with subset: no numbers at all)
        rest = [t for t in _TYPES if t not in ts and not (t == "number" and "integer" in ts)]
        return [{"type": _type_list(set(rest))}] if rest else []
    if k in _NEG_BOUND:
        other, fam = _NEG_BOUND[k]  # other types satisfy the bound vacuously
        return [{"type": fam, other: v}]
    if k in _NEG_COUNT:
        other, fam, step = _NEG_COUNT[k]
        return [{"type": fam, other: v + step}] if v + step >= 0 else []  # minLength: 0 holds
    if k == "required":
        return [{"type": "object", "properties": {name: False}} for name in v]
    if k in ("enum", "const"):
        return _other_values(v if k == "enum" else [v], subset)
    if k == "properties":
        out = []
        for name, sub in v.items():
            neg = negate(sub, inline, subset=subset)
            if neg is not False:
                out.append({"type": "object", "required": [name], "properties": {name: neg}})
        return out
    if k == "not":
        return [v]
    if k == "anyOf":
        acc: Any = True
        for b in v:
            neg = negate(b, inline, subset=subset)
            try:
                acc = merge(acc, neg, inline)
            except _NotExact:
                if not subset:
                    raise
                acc = _merge_some(acc, neg, inline)
        return [acc]
    raise _NotExact(f"not of {k}")


_LENGTH = {"string": ("minLength", "maxLength"), "array": ("minItems", "maxItems"),
           "object": ("minProperties", "maxProperties")}


def _other_values(values: list[Any], subset: bool) -> list[Any]:
    """Schemas whose union is every JSON value not in ``values`` (numbers as intervals
    between them; with ``subset``, strings, arrays and objects of other lengths only)."""
    by_type: dict[str, list[Any]] = {}
    for x in values:
        t = ("null" if x is None else "boolean" if isinstance(x, bool) else
             "number" if isinstance(x, (int, float)) else "string" if isinstance(x, str) else
             "array" if isinstance(x, list) else "object")
        by_type.setdefault(t, []).append(x)
    out: list[Any] = []
    free = [t for t in _TYPES if t not in by_type]
    if free:
        out.append({"type": _type_list(set(free))})
    taken = {_key(y) for y in values}
    literals = [x for x in (None, True, False)
                if ("null" if x is None else "boolean") in by_type and _key(x) not in taken]
    if literals:
        out.append({"enum": literals})
    if "number" in by_type:
        points = sorted({float(x) for x in by_type["number"]})
        if any(math.isinf(p) or math.isnan(p) for p in points):
            raise _NotExact("non-finite number")
        out.append({"type": "number", "exclusiveMaximum": _num(points[0])})
        out += [{"type": "number", "exclusiveMinimum": _num(lo), "exclusiveMaximum": _num(hi)}
                for lo, hi in zip(points, points[1:])]
        out.append({"type": "number", "exclusiveMinimum": _num(points[-1])})
    for t, (lo_kw, hi_kw) in _LENGTH.items():
        if t not in by_type:
            continue
        if not subset:
            raise _NotExact(f"complement of a {t} value")
        # Values of other lengths: a subset of the complement.
        lengths = sorted({len(x) for x in by_type[t]})
        out += [{"type": t, hi_kw: lengths[0] - 1}] if lengths[0] > 0 else []
        out += [{"type": t, lo_kw: a + 1, hi_kw: b - 1} for a, b in zip(lengths, lengths[1:])
                if b - a > 1]
        out.append({"type": t, lo_kw: lengths[-1] + 1})
    return out


def _num(x: float) -> int | float:
    return int(x) if x.is_integer() and abs(x) < 2**53 else x


def _value_types(s: Mapping[str, Any], defs: Mapping[str, Any] | None = None,
                 depth: int = 0) -> set[str] | None:
    """The instance types ``s`` can accept (number split into integer and fraction); None
    when any type may be. An ``anyOf``/``oneOf`` accepts the types its branches accept."""
    out: set[str] | None = None
    for key in ("anyOf", "oneOf"):
        branches = s.get(key)
        if isinstance(branches, list) and branches and defs is not None and depth < 8:
            union: set[str] | None = set()
            for b in branches:
                b = _deref(b, defs) if isinstance(b, Mapping) else b
                bt = (set() if b is False else None if not isinstance(b, Mapping)
                      else _value_types(b, defs, depth + 1))
                if bt is None or union is None:
                    union = None
                    break
                union |= bt
            if union is not None:
                out = union if out is None else out & union
    negated = s.get("not")
    if isinstance(negated, Mapping):
        target = _deref(negated, defs) if defs is not None else negated
        nt = None if target is None else _types_outside(target)
        if nt is not None:
            out = nt if out is None else out & nt
    ts = _types(s)
    if ts is not None:
        declared: set[str] = set()
        for t in ts:
            declared |= {"integer", "fraction"} if t == "number" else {t}
        out = declared if out is None else out & declared
    values = s["enum"] if isinstance(s.get("enum"), list) else (
        [s["const"]] if "const" in s else None)
    if values is not None:
        vt: set[str] = set()
        for v in values:
            if isinstance(v, bool):
                vt.add("boolean")
            elif v is None:
                vt.add("null")
            elif isinstance(v, (int, float)):
                vt.add("integer" if float(v).is_integer() else "fraction")
            elif isinstance(v, str):
                vt.add("string")
            elif isinstance(v, list):
                vt.add("array")
            else:
                vt.add("object")
        out = vt if out is None else out & vt
    return out


_VALUE_TYPES = frozenset(("null", "boolean", "object", "array", "string", "integer",
                          "fraction"))


def _types_outside(s: Mapping[str, Any]) -> set[str] | None:
    """The instance types ``{"not": s}`` can accept: those of which ``s`` does not accept
    every value. Known where ``s`` is only a ``type``, or only keywords of one instance
    type (``{"items": ...}`` holds for every non-array, so its negation takes arrays only);
    None otherwise."""
    keys = set(s) - _ANNOTATIONS
    if not keys:
        return set()
    if keys == {"type"} and (ts := _types(s)) is not None:
        accepted = set()
        for t in ts:
            accepted |= {"integer", "fraction"} if t == "number" else {t}
        return set(_VALUE_TYPES - accepted)
    families = {_FAMILY.get(k) for k in keys}
    if len(families) != 1 or None in families:
        return None
    family = families.pop()
    return {"integer", "fraction"} if family == "number" else {str(family)}


def value_types(s: Any, defs: Mapping[str, Any]) -> set[str] | None:
    """The instance types ``s`` can accept (numbers as ``"integer"`` and ``"fraction"``),
    a ``$ref`` to ``defs`` followed; None when any type may be (a sound over-approximation)."""
    if s is False:
        return set()
    target = _deref(s, defs) if isinstance(s, Mapping) else None
    return None if target is None else _value_types(target, defs)


def _values(s: Mapping[str, Any]) -> set[str] | None:
    if isinstance(s.get("enum"), list):
        return {_key(v) for v in s["enum"]}
    if "const" in s:
        return {_key(s["const"])}
    return None


def disjoint(a: Any, b: Any, defs: Mapping[str, Any], depth: int = 0) -> bool:
    """True when no instance can satisfy both ``a`` and ``b`` (a sufficient test)."""
    if a is False or b is False:
        return True
    if not isinstance(a, Mapping) or not isinstance(b, Mapping) or depth > 8:
        return False
    a, b = _deref(a, defs), _deref(b, defs)
    if a is None or b is None:
        return False
    for one, other in ((a, b), (b, a)):
        # (x1 or x2) and y is empty iff each (xk and y) is: the branches with the keywords
        # beside them (a oneOf accepts a subset of what the same anyOf accepts).
        for key in ("anyOf", "oneOf"):
            branches = one.get(key)
            if isinstance(branches, list) and branches and depth < 4 and (
                    len(branches) <= MAX_BRANCHES):
                rest = {k: v for k, v in one.items() if k != key}
                parts = []
                for branch in branches:
                    try:
                        parts.append(merge(rest, branch, _no_inline))
                    except _NotExact:
                        parts.append(branch)  # a superset of the conjunction
                if all(disjoint(p, other, defs, depth + 1) for p in parts):
                    return True
    ta, tb = _value_types(a, defs), _value_types(b, defs)
    common = (ta if ta is not None else {"null", "boolean", "object", "array", "string",
                                          "integer", "fraction"})
    if tb is not None:
        common = common & tb
    if not common:
        return True
    va, vb = _values(a), _values(b)
    if va is not None and vb is not None and not va & vb:
        return True
    if common == {"string"}:
        # A pattern that is one literal string (`^success$`) against another, or against
        # values: the only string it takes is not the other side's.
        la, lb = _literal(a.get("pattern")), _literal(b.get("pattern"))
        if la is not None and lb is not None and la != lb:
            return True
        for lit, values in ((la, vb), (lb, va)):
            if lit is not None and values is not None and _key(lit) not in values:
                return True
    if common == {"object"}:
        pa, pb = a.get("properties") or {}, b.get("properties") or {}
        req = set(a.get("required") or []) & set(b.get("required") or [])
        if any(p in pa and p in pb and disjoint(pa[p], pb[p], defs, depth + 1) for p in req):
            return True
        # A property one side requires and the other forbids.
        for one, other, props in ((a, b, pb), (b, a, pa)):
            closed = other.get("additionalProperties") is False and not other.get(
                "patternProperties")
            if any(props.get(p) is False or (closed and p not in props)
                   for p in one.get("required") or []):
                return True
    return False


def _literal(pattern: Any) -> str | None:
    """The one string an anchored pattern of plain characters (``^abc$``) matches."""
    if not isinstance(pattern, str) or not (
            pattern.startswith("^") and pattern.endswith("$") and len(pattern) >= 2):
        return None
    body = pattern[1:-1]
    return body if all(c.isalnum() or c in _PLAIN_PUNCTUATION for c in body) else None


#: Characters that stand for themselves in a regex (outside a class), besides letters and
#: digits.
_PLAIN_PUNCTUATION = frozenset(" _-:,;=@#%&'\"<>/!~`")


def _deref(s: Mapping[str, Any], defs: Mapping[str, Any]) -> Mapping[str, Any] | None:
    for _ in range(8):
        ref = s.get("$ref")
        if not isinstance(ref, str):
            return s
        if not ref.startswith("#/$defs/") or (len(s) > 1 and s.keys() - _ANNOTATIONS - {"$ref"}):
            return None
        target = defs.get(ref[len("#/$defs/"):])
        if not isinstance(target, Mapping):
            return None
        s = target
    return None


def _only_type(s: Any, t: str) -> Any:
    """``s`` restricted to instances of type ``t``, without the keywords of other types
    (they hold vacuously there)."""
    if not isinstance(s, dict):
        return s
    fam = "number" if t == "integer" else t
    return {k: v for k, v in s.items() if _FAMILY.get(k, fam) == fam}


def _pairwise_disjoint(branches: list[Any], defs: Mapping[str, Any]) -> bool:
    return all(disjoint(branches[i], branches[j], defs)
               for i in range(len(branches)) for j in range(i + 1, len(branches)))


def merge_type(branch: Any, context: Mapping[str, Any], defs: Mapping[str, Any]) -> Any:
    """``branch`` with the parent's ``type`` and ``required`` added (for the disjointness
    test: every instance meets them, so branches need only be disjoint where they hold). A
    branch that is a ``$ref`` alone to one of ``defs`` is its target here, so that the types
    the parent rules out are left out of an untyped target too (the branches of ``{"type":
    "object", "oneOf": [{"$ref": ...}, ...]}`` need only be disjoint on objects)."""
    if not context or not isinstance(branch, Mapping):
        return branch
    target = _deref(branch, defs)
    try:
        return merge(dict(branch if target is None else target), dict(context), _no_inline)
    except _NotExact:
        return branch


def _no_inline(ref: str) -> Any:
    raise _NotExact(f"$ref {ref} not inlined")
