"""Grammar specs: what a request is constrained to, validated before any compile.

A :class:`GrammarSpec` is immutable and hashable; ``spec.key`` identifies it in the caches
(together with the engine, the tokenizer fingerprint and the library versions).
"""

from __future__ import annotations

import hashlib
import json
import re
import warnings
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from .errors import GrammarSpecError

__all__ = ["SPEC_KINDS", "GrammarSpec"]

SPEC_KINDS = ("json_schema", "any_json", "regex", "ebnf", "choice", "structural_tag")


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
    #: schemas: validating them takes seconds, which must not block the caller).
    deferred_check: bool = field(default=False, compare=False)

    def __post_init__(self) -> None:
        if self.kind not in SPEC_KINDS:
            raise ValueError(f"unknown spec kind {self.kind!r}; known: {', '.join(SPEC_KINDS)}")
        digest = hashlib.sha256(f"{self.kind}\0{self.text}\0{self.options!r}".encode())
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
            _validate_meta(self.payload, "")

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

        The language is the same on every engine (``docs/runtime.md``, "JSON schema
        semantics"): JSON Schema's, so undeclared properties are allowed unless the schema
        forbids them; ``strict=True`` forbids them in every object schema that does not say
        (``additionalProperties: false`` added before any engine sees the schema).

        The schema is checked against its draft's meta-schema (with ``jsonschema`` when it
        is installed); a remote ``$ref`` is rejected, never fetched. Errors raise
        :class:`GrammarSpecError` with the JSON pointer of the offending part.
        """
        if isinstance(schema, str):
            try:
                schema = json.loads(schema)
            except json.JSONDecodeError as exc:
                raise GrammarSpecError(f"schema is not valid JSON: {exc}") from exc
        if not isinstance(schema, (Mapping, bool)):
            raise TypeError(
                f"schema must be a dict, a bool or JSON text, got {type(schema).__name__}"
            )
        # Key order is kept: engines generate properties in schema order.
        text = json.dumps(schema, ensure_ascii=False, separators=(",", ":"))
        deferred = False
        if validate:
            _validate_refs(schema, "")
            if len(text) <= DEFER_CHECK_ABOVE_CHARS:
                _validate_meta(schema, "")
            else:
                deferred = True
        return cls("json_schema", text, (("any_whitespace", bool(any_whitespace)),
                                         ("strict", bool(strict))), deferred_check=deferred)

    def engine_schema_text(self) -> str:
        """The JSON schema text every engine compiles for this ``json_schema`` spec (the
        strict variant applied)."""
        if self.kind != "json_schema":
            raise ValueError(f"engine_schema_text needs a json_schema spec, got {self.kind!r}")
        if not self.option("strict", False):
            return self.text
        from .json_semantics import strict_schema

        return json.dumps(strict_schema(self.payload), ensure_ascii=False, separators=(",", ":"))

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
        if not triggers:
            raise GrammarSpecError("structural_tag needs at least one trigger")
        if not tags:
            raise GrammarSpecError("structural_tag needs at least one tag")
        clean = []
        for i, tag in enumerate(tags):
            missing = {"begin", "schema", "end"} - set(tag)
            if missing:
                raise GrammarSpecError(f"tag {i} lacks {sorted(missing)}", pointer=f"/tags/{i}")
            if not any(tag["begin"].startswith(t) for t in triggers):
                raise GrammarSpecError(
                    f"tag {i} begin {tag['begin']!r} starts with none of the triggers "
                    f"{list(triggers)!r}", pointer=f"/tags/{i}/begin",
                )
            _validate_schema(tag["schema"], base=f"/tags/{i}/schema")
            clean.append({"begin": tag["begin"], "schema": tag["schema"], "end": tag["end"]})
        text = json.dumps({"tags": clean, "triggers": list(triggers)}, ensure_ascii=False)
        return cls("structural_tag", text)


# -- JSON schema validation ----------------------------------------------------------------
#: Schemas whose JSON text is longer are checked against the meta-schema in the compile job.
DEFER_CHECK_ABOVE_CHARS = 65536


def _validate_schema(schema: Any, base: str = "") -> None:
    _validate_refs(schema, base)
    _validate_meta(schema, base)


def _validate_refs(schema: Any, base: str) -> None:
    if not isinstance(schema, (Mapping, bool)):
        raise GrammarSpecError(
            f"a JSON schema must be an object or a bool, got {type(schema).__name__}",
            pointer=base or "/",
        )
    for pointer, ref in _iter_refs(schema, base):
        if not ref.startswith("#"):
            raise GrammarSpecError(
                f"remote $ref {ref!r} is not supported (remote references are never fetched)",
                pointer=pointer,
            )


def _validate_meta(schema: Any, base: str) -> None:
    try:
        import jsonschema
        from jsonschema.validators import validator_for
    except ImportError:  # validation by the meta-schema is optional
        return
    if isinstance(schema, bool):
        return
    validator = validator_for(schema, default=jsonschema.Draft202012Validator)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        error = jsonschema.exceptions.best_match(
            validator(validator.META_SCHEMA).iter_errors(schema)
        )
    if error is not None:
        pointer = base + "".join(f"/{_escape(p)}" for p in error.path)
        raise GrammarSpecError(f"invalid JSON schema: {error.message[:300]}", pointer=pointer or "/")


def _iter_refs(node: Any, pointer: str) -> Iterator[tuple[str, str]]:
    if isinstance(node, Mapping):
        for k, v in node.items():
            child = f"{pointer}/{_escape(str(k))}"
            if k == "$ref" and isinstance(v, str):
                yield child, v
            elif k not in ("enum", "const", "default", "examples"):
                yield from _iter_refs(v, child)
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield from _iter_refs(v, f"{pointer}/{i}")


def _escape(part: Any) -> str:
    return str(part).replace("~", "~0").replace("/", "~1")
