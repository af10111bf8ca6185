"""The strict variants of a schema: ours (:func:`strict_schema`, no undeclared properties),
and xgrammar's ``strict_mode`` language written out closed (:func:`xgrammar_strict_schema`) or
open (:func:`xgrammar_open_schema`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .walk import _children_mapped

__all__ = ["strict_schema", "xgrammar_strict_schema", "xgrammar_open_schema"]


def _is_object(s: Mapping[str, Any]) -> bool:
    kind = s.get("type")
    return kind == "object" or (isinstance(kind, list) and "object" in kind) or (
        "properties" in s)


def strict_schema(schema: Any) -> Any:
    """``schema`` with ``"additionalProperties": false`` on every object schema that does not
    say (the strict variant: no undeclared properties); a new object, ``schema`` untouched."""
    if isinstance(schema, list):
        return [strict_schema(s) for s in schema]
    if not isinstance(schema, Mapping):
        return schema
    out = _children_mapped(schema, strict_schema)
    if _is_object(out) and not {"additionalProperties", "patternProperties",
                          "unevaluatedProperties"} & set(out):
        out["additionalProperties"] = False
    return out


def xgrammar_strict_schema(schema: Any) -> Any:
    """``schema`` in the language of xgrammar's ``strict_mode``, which the xgrammar
    backends of SGLang and vLLM compile JSON schemas with (a new object; ``schema`` untouched).

    Checked against xgrammar 0.2.8 (``tests/sglang_plugin/test_sglang_backend.py``,
    ``tests/vllm_plugin/test_vllm_backend033.py``): an object
    schema that names properties (``properties``, ``required``, ``minProperties``,
    ``maxProperties``) and does not say otherwise allows no others; one that names none
    stays any object (SGLang's ``json_object`` response format sends ``{"type": "object"}``);
    ``prefixItems`` without ``items`` allows no further items.
    """
    return _xgrammar_strict_defaults(schema, False)


def xgrammar_open_schema(schema: Any) -> Any:
    """``schema`` with what xgrammar's ``strict_mode`` would close said open explicitly (a
    new object): ``additionalProperties: true`` / ``items: true`` where
    :func:`xgrammar_strict_schema` writes ``false``. xgrammar compiles a structural tag's
    schemas in strict mode, which has no switch; written out, JSON Schema's own defaults
    hold there too."""
    return _xgrammar_strict_defaults(schema, True)


def _xgrammar_strict_defaults(schema: Any, value: bool) -> Any:
    """``schema`` with ``value`` written where xgrammar's ``strict_mode`` closes objects and
    arrays that do not say (see :func:`xgrammar_strict_schema`)."""
    if isinstance(schema, list):
        return [_xgrammar_strict_defaults(s, value) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = _children_mapped(schema, lambda s: _xgrammar_strict_defaults(s, value))
    if (_is_object(out) and not {"additionalProperties", "patternProperties",
                           "unevaluatedProperties"} & out.keys()
            and {"properties", "required", "minProperties", "maxProperties"} & out.keys()):
        out["additionalProperties"] = value
    if "prefixItems" in out and not {"items", "additionalItems", "unevaluatedItems"} & out.keys():
        out["items"] = value
    return out
