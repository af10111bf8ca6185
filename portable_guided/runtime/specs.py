"""Grammar specs: what a request is constrained to, validated before any compile.

A :class:`GrammarSpec` is immutable and hashable; ``spec.key`` identifies it in the caches
(together with the engine, the tokenizer fingerprint and the library versions).
"""

from __future__ import annotations

import hashlib
import json
import re
import urllib.parse
import warnings
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

# Modules, not names: the front end imports .errors, which may be what is importing us.
from ..json_schema import dialects as _dialects
from ..json_schema import normalise as _normalise
from ..json_schema.dialects import DATA_KEYWORDS, SCHEMA_MAP_KEYWORDS
from ..json_schema.meta_fast import proves_valid
from ..json_schema.pointers import escape_pointer
from .errors import GrammarSpecError

__all__ = ["SPEC_KINDS", "GrammarSpec"]

SPEC_KINDS = ("json_schema", "any_json", "regex", "ebnf", "choice", "structural_tag",
              "xgrammar_structural_tag")


@dataclass(frozen=True)
class GrammarSpec:
    """One grammar constraint. Build it with a class method, never directly.

    >>> GrammarSpec.json_schema({"type": "object", "properties": {"a": {"type": "integer"}}})
    GrammarSpec(kind='json_schema', ...)
    >>> GrammarSpec.regex(r"[0-9]{3}-[0-9]{4}").kind
    'regex'
    """

    kind: str
    #: Canonical JSON text of the payload (schema, pattern, grammar, choices or tags).
    text: str
    #: Options that change the compiled grammar (e.g. ``any_whitespace`` for JSON).
    options: tuple[tuple[str, Any], ...] = ()
    key: str = field(default="", compare=False)
    #: True when validation against the meta-schema was deferred to the compile job (large
    #: schemas not proven valid by ``meta_fast``: validating them takes up to seconds, which
    #: must not block the caller).
    deferred_check: bool = field(default=False, compare=False)

    def __post_init__(self) -> None:
        if self.kind not in SPEC_KINDS:
            raise ValueError(f"unknown spec kind {self.kind!r}; known: {', '.join(SPEC_KINDS)}")
        try:
            raw = f"{self.kind}\0{self.text}\0{self.options!r}".encode()
        except UnicodeEncodeError as exc:  # a lone surrogate: no engine can match it
            bad = exc.object[exc.start:exc.end]
            raise GrammarSpecError(
                f"{self.kind} spec contains {bad!r} (a lone UTF-16 surrogate, not valid "
                f"Unicode text) at character {exc.start}") from None
        digest = hashlib.sha256(raw)
        object.__setattr__(self, "key", digest.hexdigest())

    def __repr__(self) -> str:
        body = self.text if len(self.text) <= 60 else self.text[:57] + "..."
        return f"GrammarSpec(kind={self.kind!r}, {body!s})"

    @property
    def payload(self) -> Any:
        """The decoded payload (schema dict, pattern, grammar text, choices or tags)."""
        return json.loads(self.text)

    def option(self, name: str, default: Any = None) -> Any:
        """The value of compile option ``name``."""
        return dict(self.options).get(name, default)

    def to_dict(self) -> dict[str, Any]:
        """A picklable, JSON-able form (sent to compile workers)."""
        return {"kind": self.kind, "text": self.text, "options": [list(o) for o in self.options],
                "deferred_check": self.deferred_check}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> GrammarSpec:
        """Inverse of :meth:`to_dict` (no re-validation)."""
        return cls(data["kind"], data["text"], tuple((k, v) for k, v in data["options"]),
                   deferred_check=bool(data.get("deferred_check", False)))

    def run_deferred_check(self) -> None:
        """Run the validation deferred at construction (called by the compile job, under
        its time limit); raises :class:`GrammarSpecError`."""
        if self.deferred_check:
            schema = self.payload
            if not proves_valid(schema):  # microseconds where jsonschema takes milliseconds
                _validate_meta(schema, "")

    # -- constructors ----------------------------------------------------------------------
    @classmethod
    def json_schema(
        cls,
        schema: Mapping[str, Any] | bool | str,
        *,
        any_whitespace: bool = True,
        strict: bool = False,
        validate: bool = True,
    ) -> GrammarSpec:
        """A JSON value that validates against ``schema`` (dict, bool or JSON text).

        The language is the same on every engine (``docs/json_schema.md``): JSON Schema's,
        so undeclared properties are allowed unless the schema forbids them; ``strict=True``
        forbids them in every object schema that does not say (``additionalProperties:
        false`` added before any engine sees the schema).

        The schema is read under the draft its ``$schema`` names (4, 6, 7, 2019-09 or
        2020-12, the default; any other is refused) and checked against that draft's
        meta-schema (with ``jsonschema`` when it is installed); engines get its draft 2020-12
        equivalent (``docs/json_schema.md``, "Dialects"). A remote ``$ref`` is rejected, never
        fetched. Errors raise
        :class:`GrammarSpecError` with the JSON pointer of the offending part. A large
        schema that the quick proof (``meta_fast``) cannot vouch for is checked in the
        compile job instead (``deferred_check``), so building a spec never blocks: the
        request then fails with the same message.
        """
        if isinstance(schema, str):
            try:
                schema = json.loads(schema)
            except json.JSONDecodeError as exc:
                raise GrammarSpecError(f"schema is not valid JSON: {exc}") from exc
            except RecursionError:
                raise GrammarSpecError(f"schema nests deeper than {MAX_SCHEMA_DEPTH} "
                                       "levels") from None
        if not isinstance(schema, (Mapping, bool)):
            raise TypeError(
                f"schema must be a dict, a bool or JSON text, got {type(schema).__name__}"
            )
        values = _check_depth(schema)
        dialect = _dialects.dialect_of(schema)  # refuses draft 3 and unknown URIs
        # Key order is kept: engines generate properties in schema order.
        text = json.dumps(schema, ensure_ascii=False, separators=(",", ":"))
        deferred = False
        if dialect is _dialects.LATEST:  # (most schemas: no walk, no copy)
            if text.count('"$schema"') > (isinstance(schema, Mapping) and "$schema" in schema):
                _normalise.check_nested_dialects(schema, dialect)
            if validate:
                _validate_refs(schema, "", text)
                deferred = _check_meta_unless_slow(schema, len(text), values)
        else:
            # Checked under the declared draft, then stored in its 2020-12 form, the only one
            # the lowering and the engines read. A check left to the compile job (or skipped
            # by the caller, who may defer it) needs the declared form: the text then stays as
            # declared, and engine_schema_text() rewrites it in the compile job.
            if validate:
                deferred = _check_meta_unless_slow(schema, len(text), values)
            normalised = _normalise.normalise(schema, dialect)
            if validate:
                _validate_refs(normalised, "")
                if not deferred:
                    text = json.dumps(normalised, ensure_ascii=False, separators=(",", ":"))
        return cls("json_schema", text, (("any_whitespace", bool(any_whitespace)),
                                         ("strict", bool(strict))), deferred_check=deferred)

    def engine_schema_text(self) -> str:
        """The JSON schema text every engine compiles for this ``json_schema`` spec: draft
        2020-12 whatever draft the schema declared (:mod:`portable_guided.json_schema.\
normalise`), the strict variant applied."""
        if self.kind != "json_schema":
            raise ValueError(f"engine_schema_text needs a json_schema spec, got {self.kind!r}")
        text = self.text
        if '"$schema"' in text and not all(_LATEST_URI.fullmatch(uri) for uri
                                           in _SCHEMA_URI.findall(text)):
            # Kept as declared (its check deferred, or skipped): rewritten to 2020-12 here.
            schema = self.payload
            dialect = _dialects.dialect_of(schema)
            if dialect is not _dialects.LATEST:
                text = json.dumps(_normalise.normalise(schema, dialect), ensure_ascii=False,
                                  separators=(",", ":"))
        if not self.option("strict", False):
            return text
        from ..json_schema.strict import strict_schema

        return json.dumps(strict_schema(json.loads(text)), ensure_ascii=False,
                          separators=(",", ":"))

    @classmethod
    def any_json(cls, *, any_whitespace: bool = True) -> GrammarSpec:
        """Any JSON object (the ``response_format={"type": "json_object"}`` mode)."""
        return cls("any_json", "null", (("any_whitespace", bool(any_whitespace)),))

    @classmethod
    def regex(cls, pattern: str) -> GrammarSpec:
        """Text that fully matches ``pattern`` (ECMAScript-like syntax, as the engines use)."""
        if not isinstance(pattern, str):
            raise TypeError(f"pattern must be a str, got {type(pattern).__name__}")
        if not pattern:
            raise GrammarSpecError("regex pattern is empty")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            try:
                re.compile(pattern)
            except (OverflowError, RecursionError) as exc:  # e.g. a{4294967295}
                raise GrammarSpecError(f"invalid regex {pattern[:80]!r}: {exc}") from None
            except re.error as exc:
                # Python's syntax is close to the engines'; report its diagnosis, except for
                # Unicode classes (\p{..}) that only the engines understand.
                if "\\p" not in pattern and "\\P" not in pattern:
                    raise GrammarSpecError(
                        f"invalid regex {pattern!r}: {exc.msg} at position {exc.pos}"
                    ) from exc
        return cls("regex", json.dumps(pattern, ensure_ascii=False))

    @classmethod
    def ebnf(cls, grammar: str, *, root: str = "root") -> GrammarSpec:
        """A GBNF/EBNF grammar (llama.cpp / xgrammar syntax) whose start rule is ``root``."""
        if not isinstance(grammar, str):
            raise TypeError(f"grammar must be a str, got {type(grammar).__name__}")
        if not re.search(rf"(^|\n)\s*{re.escape(root)}\s*::=", grammar):
            raise GrammarSpecError(f"EBNF grammar has no rule for its root {root!r} ('{root} ::= ...')")
        return cls("ebnf", json.dumps(grammar, ensure_ascii=False), (("root", root),))

    @classmethod
    def choice(cls, choices: Sequence[str]) -> GrammarSpec:
        """Exactly one of the strings in ``choices``."""
        if isinstance(choices, str) or not isinstance(choices, Sequence):
            raise TypeError(f"choices must be a sequence of str, got {type(choices).__name__}")
        if not choices:
            raise GrammarSpecError("choice needs at least one string")
        bad = [c for c in choices if not isinstance(c, str)]
        if bad:
            raise TypeError(f"every choice must be a str, got {bad[:3]!r}")
        if any(c == "" for c in choices):
            raise GrammarSpecError("choice contains an empty string")
        return cls("choice", json.dumps(list(choices), ensure_ascii=False))

    @classmethod
    def structural_tag(
        cls, tags: Sequence[Mapping[str, Any]], triggers: Sequence[str]
    ) -> GrammarSpec:
        """Free text in which tool calls are constrained (xgrammar's ``structural_tag``).

        ``tags`` are ``{"begin": "<function=get_weather>", "schema": {...}, "end":
        "</function>"}``; ``triggers`` are prefixes of ``begin`` (e.g. ``"<function="``)
        that start a constrained segment.

        >>> GrammarSpec.structural_tag(
        ...     [{"begin": "<function=f>", "schema": {"type": "object"}, "end": "</function>"}],
        ...     ["<function="]).kind
        'structural_tag'
        """
        if isinstance(triggers, str) or not isinstance(triggers, Sequence):
            raise TypeError(f"triggers must be a sequence of str, got {type(triggers).__name__}")
        if isinstance(tags, (str, Mapping)) or not isinstance(tags, Sequence):
            raise TypeError(f"tags must be a sequence of dicts, got {type(tags).__name__}")
        if not triggers:
            raise GrammarSpecError("structural_tag needs at least one trigger")
        if not tags:
            raise GrammarSpecError("structural_tag needs at least one tag")
        bad = [t for t in triggers if not isinstance(t, str) or not t]
        if bad:
            raise TypeError(f"every trigger must be a non-empty str, got {bad[:3]!r}")
        clean = []
        for i, tag in enumerate(tags):
            if not isinstance(tag, Mapping):
                raise TypeError(f"tag {i} must be a dict, got {type(tag).__name__}")
            missing = {"begin", "schema", "end"} - set(tag)
            if missing:
                raise GrammarSpecError(f"tag {i} lacks {sorted(missing)}", pointer=f"/tags/{i}")
            for part in ("begin", "end"):
                if not isinstance(tag[part], str):
                    raise TypeError(f"tag {i} {part} must be a str, got "
                                    f"{type(tag[part]).__name__} ({tag[part]!r:.60})")
            if not tag["begin"]:
                raise GrammarSpecError(f"tag {i} begin is empty", pointer=f"/tags/{i}/begin")
            if not any(tag["begin"].startswith(t) for t in triggers):
                raise GrammarSpecError(
                    f"tag {i} begin {tag['begin']!r} starts with none of the triggers "
                    f"{list(triggers)!r}", pointer=f"/tags/{i}/begin",
                )
            schema = _validate_schema(tag["schema"], base=f"/tags/{i}/schema")
            clean.append({"begin": tag["begin"], "schema": schema, "end": tag["end"]})
        text = json.dumps({"tags": clean, "triggers": list(triggers)}, ensure_ascii=False)
        return cls("structural_tag", text)

    @classmethod
    def xgrammar_structural_tag(cls, tag: Mapping[str, Any] | str) -> GrammarSpec:
        """xgrammar's own structural tag (``{"type": "structural_tag", "format": {...}}``,
        any of its formats: nested tags, ``at_least_one``, ``excludes`` ...), compiled by
        xgrammar as written: xgrammar's language, on the xgrammar engine only (``auto``
        takes it there). What engines hand over as is, so that such a compile still runs
        under the runtime's time limit and off their event loop;
        :meth:`structural_tag` is the form every engine compiles, in this library's
        JSON Schema language.

        >>> GrammarSpec.xgrammar_structural_tag({"type": "structural_tag", "format": {
        ...     "type": "const_string", "value": "yes"}}).kind
        'xgrammar_structural_tag'
        """
        if isinstance(tag, str):
            try:
                tag = json.loads(tag)
            except ValueError as exc:
                raise GrammarSpecError(f"structural tag is not JSON: {exc}") from None
        if not isinstance(tag, Mapping):
            raise TypeError(f"structural tag must be a dict, got {type(tag).__name__}")
        if tag.get("type") != "structural_tag" or not isinstance(tag.get("format"), Mapping):
            raise GrammarSpecError(
                "an xgrammar structural tag is {\"type\": \"structural_tag\", \"format\": "
                f"{{...}}}}, got keys {sorted(tag)!r} and type {tag.get('type')!r}")
        # Key order kept: it is the order xgrammar generates a schema's properties in.
        return cls("xgrammar_structural_tag",
                   json.dumps(tag, ensure_ascii=False, separators=(",", ":")))


# -- JSON schema validation ----------------------------------------------------------------
#: A ``"$schema"`` member of canonical JSON text (a cheap test for "kept as declared").
_SCHEMA_URI = re.compile(r'"\$schema":"([^"]*)"')  # (an escaped quote: not 2020-12's URI)
#: The URIs naming draft 2020-12 (with or without ``#``, http or https).
_LATEST_URI = re.compile(r"https?://json-schema\.org/draft/2020-12/schema/?#?")
#: Schemas whose JSON text is longer are checked against the meta-schema in the compile job
#: (which first tries the quick proof, ``meta_fast.proves_valid``).
DEFER_CHECK_ABOVE_CHARS = 65536

#: Schemas the quick proof cannot vouch for (another draft, a keyword it does not check, an
#: invalid schema) with more JSON values than this are checked in the compile job too.
#: ``jsonschema`` spends up to about 0.2 ms per value on the draft 2020-12 meta-schema (an
#: ``anyOf`` of 21,000 ``{}``, under 64 KB, took 3.6 s on a 2-core VM), so this bounds the
#: check run at build time to about 25 ms; 131 of MaskBench's 3,492 unproven schemas are
#: larger.
DEFER_UNPROVEN_ABOVE_VALUES = 128


#: Deepest JSON nesting of a schema (MaskBench's deepest is 63): deeper ones are refused
#: before any recursive code (the meta-schema check, the engines) meets them.
MAX_SCHEMA_DEPTH = 128


def _check_depth(schema: Any, base: str = "") -> int:
    """Refuse a schema nesting deeper than :data:`MAX_SCHEMA_DEPTH` (iteratively, level by
    level: a recursive walk is what must not meet such a schema); returns how many JSON
    values (at every depth, the schema itself included) it holds."""
    level = [schema]
    values = 0
    for _ in range(MAX_SCHEMA_DEPTH):
        values += len(level)
        below: list[Any] = []
        for node in level:
            if isinstance(node, dict):  # before the slower ABC checks
                below.extend(node.values())
            elif isinstance(node, list):
                below.extend(node)
            elif isinstance(node, Mapping):
                below.extend(node.values())
        if not below:
            return values
        level = below
    raise GrammarSpecError(f"schema nests deeper than {MAX_SCHEMA_DEPTH} levels",
                           pointer=base or "/")


def _check_meta_unless_slow(schema: Any, chars: int, values: int) -> bool:
    """Check ``schema`` (``chars`` of JSON text, ``values`` JSON values) against its
    meta-schema now unless that could take long; True when the check is left to the compile
    job (:meth:`GrammarSpec.run_deferred_check`, under its time limit)."""
    if chars > DEFER_CHECK_ABOVE_CHARS:
        return True  # the compile job tries the quick proof first
    if proves_valid(schema):  # milliseconds where the full check takes seconds
        return False
    if values > DEFER_UNPROVEN_ABOVE_VALUES:
        return True
    _validate_meta(schema, "")
    return False


def _validate_schema(schema: Any, base: str = "") -> Any:
    """Check a schema embedded in another spec (a structural tag's) completely, now;
    returns its draft 2020-12 form (the only one engines read)."""
    _check_depth(schema, base)
    try:
        dialect = _dialects.dialect_of(schema)
    except GrammarSpecError as exc:
        raise GrammarSpecError(str(exc).rsplit(" at ", 1)[0], pointer=f"{base}/$schema") from None
    if dialect is _dialects.LATEST:
        _validate_refs(schema, base)
        if not proves_valid(schema):
            _validate_meta(schema, base)
        return schema
    if not proves_valid(schema):
        _validate_meta(schema, base)
    normalised = _normalise.normalise(schema, dialect)
    _validate_refs(normalised, base)
    return normalised


def _validate_refs(schema: Any, base: str, text: str | None = None) -> None:
    """Refuse a remote reference in ``schema`` (``text``, its JSON text, when known: a
    schema whose text never spells a reference keyword has none, and is not walked)."""
    if not isinstance(schema, (Mapping, bool)):
        raise GrammarSpecError(
            f"a JSON schema must be an object or a bool, got {type(schema).__name__}",
            pointer=base or "/",
        )
    if text is not None and not any(f'"{key}"' in text for key in _REF_KEYWORDS):
        return
    refs = list(_iter_refs(schema, base))
    resources = {_LOCAL_BASE, *(uri for _, key, uri in refs if key == "$id")}
    for pointer, key, ref in refs:
        if key == "$id":
            continue
        # Local: a fragment of this document, or a resource it embeds under an `$id`.
        local = isinstance(ref, str) and (ref.startswith("#") or ref.split("#")[0] in resources)
        if not local:
            raise GrammarSpecError(
                f"remote {key} {ref!r:.200} is not supported (remote references are never "
                "fetched)", pointer=pointer,
            )


def _validate_meta(schema: Any, base: str) -> None:
    try:
        import jsonschema
    except ImportError:  # validation by the meta-schema is optional
        return
    if isinstance(schema, bool):
        return
    validator = getattr(jsonschema, _dialects.dialect_of(schema).validator)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            error = jsonschema.exceptions.best_match(
                validator(validator.META_SCHEMA).iter_errors(schema)
            )
        except RecursionError:
            raise GrammarSpecError("schema nests too deeply to be checked against its "
                                   "meta-schema", pointer=base or "/") from None
    if error is not None:
        pointer = base + "".join(f"/{_escape(p)}" for p in error.path)
        raise GrammarSpecError(f"invalid JSON schema: {error.message[:300]}", pointer=pointer or "/")


#: Keywords whose values are data, never schemas: a ``$ref`` inside them is not a reference.
_DATA_KEYWORDS = frozenset(DATA_KEYWORDS)
#: Keywords whose values map names (chosen by the user) to schemas.
_NAMED_SCHEMA_KEYWORDS = frozenset(SCHEMA_MAP_KEYWORDS)
#: The base URI of a schema without ``$id``: references resolve against it, and nothing can
#: be fetched from it.
_LOCAL_BASE = "https://portable-guided.invalid/root.json"
#: Keywords that reference other schemas by URI.
_REF_KEYWORDS = ("$ref", "$dynamicRef", "$recursiveRef")


def _iter_refs(node: Any, pointer: str) -> Iterator[tuple[str, str, Any]]:
    """Every reference keyword of the schema ``node`` and every embedded resource:
    (pointer, keyword, value), a reference's value made absolute against the base URI of the
    schema holding it (relative to :data:`_LOCAL_BASE` when no ``$id`` sets one); for
    ``$id``, the resource's absolute URI.

    Walks the schema's structure: the names under ``properties`` (and the like) are user
    data, so a property named ``default`` or ``enum`` is searched like any other, while the
    values of data keywords (``enum``, ``const``, ``default``, ``examples``) are skipped.
    """
    stack: list[tuple[Any, str, str]] = [(node, pointer, _LOCAL_BASE)]
    while stack:
        schema, where, base = stack.pop()
        if isinstance(schema, list):
            stack.extend((v, f"{where}/{i}", base) for i, v in enumerate(schema))
            continue
        if not isinstance(schema, Mapping):
            continue
        own_id = schema.get("$id")
        if isinstance(own_id, str) and not own_id.startswith("#"):
            base = urllib.parse.urljoin(base, own_id).split("#")[0]
            yield f"{where}/$id", "$id", base
        for key, value in schema.items():
            child = f"{where}/{_escape(str(key))}"
            if key in _REF_KEYWORDS:
                if isinstance(value, str) and not value.startswith("#"):
                    value = urllib.parse.urljoin(base, value)
                yield child, key, value
            elif key in _DATA_KEYWORDS:
                continue
            elif key in _NAMED_SCHEMA_KEYWORDS and isinstance(value, Mapping):
                stack.extend((sub, f"{child}/{_escape(str(name))}", base)
                             for name, sub in value.items())
            else:
                stack.append((value, child, base))


_escape = escape_pointer
