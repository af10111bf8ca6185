"""The xgrammar engine (the default)."""

from __future__ import annotations

import json
import threading
from collections.abc import Sequence
from typing import Any

from ..json_semantics import xgrammar_unsupported
from ..specs import GrammarSpec
from .base import Engine, Matcher, UnsupportedSpec, package_version

__all__ = ["XGrammarEngine", "XGrammarMatcher", "xgrammar_structural_tag"]


class XGrammarMatcher(Matcher):
    """A request's ``xgrammar.GrammarMatcher``."""

    __slots__ = ("_fill", "_m")

    def __init__(self, matcher: Any) -> None:
        self._m = matcher
        # The binding's method skips one Python frame per mask (the public wrapper only
        # forwards to it); fall back to the public method if the layout changes.
        handle = getattr(matcher, "_handle", None)
        if handle is not None and hasattr(handle, "fill_next_token_bitmask"):
            self._fill = handle.fill_next_token_bitmask
        else:
            self._fill = lambda bm, row, _debug: matcher.fill_next_token_bitmask(bm, row)

    def accept(self, token_id: int) -> bool:
        return bool(self._m.accept_token(token_id))

    def rollback(self, n: int) -> None:
        if n:
            self._m.rollback(n)

    def fill(self, bitmask: Any, row: int) -> None:
        self._fill(bitmask, row, False)

    def is_terminated(self) -> bool:
        return bool(self._m.is_terminated())

    def jump_forward(self) -> str:
        return str(self._m.find_jump_forward_string())

    @property
    def raw(self) -> Any:
        """The underlying ``xgrammar.GrammarMatcher``."""
        return self._m


class XGrammarEngine(Engine):
    """Compiles with ``xgrammar.GrammarCompiler`` and fills with ``BatchGrammarMatcher``."""

    name = "xgrammar"
    fill_releases_gil = True  # GrammarMatcher.fill_next_token_bitmask releases it

    def __init__(self, tokenizer_info: Any, *, fill_threads: int = 1) -> None:
        import xgrammar as xgr

        self._xgr = xgr
        self.tokenizer_info = tokenizer_info
        # Our own caches sit above; the compiler's cache would double-count memory.
        self._compiler = xgr.GrammarCompiler(tokenizer_info, max_threads=1, cache_enabled=False)
        self._batch = xgr.BatchGrammarMatcher(max_threads=max(1, int(fill_threads)))
        # One batch fill at a time per engine: the batch matcher owns one thread pool.
        self._batch_lock = threading.Lock()

    @staticmethod
    def version() -> str:
        return package_version("xgrammar")

    @classmethod
    def from_payload(cls, payload: Any) -> XGrammarEngine:
        from ..tokenizer_info import xgrammar_info_from_payload

        return cls(xgrammar_info_from_payload(payload))

    def compile(self, spec: GrammarSpec) -> Any:
        c = self._compiler
        kind, data = spec.kind, spec.payload
        if kind == "json_schema":
            # One language on every engine (json_semantics): strictness is in the schema
            # text, never xgrammar's strict_mode (which also forbids array items that no
            # `items` declares), and keywords xgrammar would ignore make it refuse.
            text = spec.engine_schema_text()
            problems = xgrammar_unsupported(json.loads(text))
            if problems:
                more = f" (and {len(problems) - 3} more)" if len(problems) > 3 else ""
                raise UnsupportedSpec("; ".join(problems[:3]) + more)
            return c.compile_json_schema(
                text, any_whitespace=spec.option("any_whitespace", True), strict_mode=False
            )
        if kind == "any_json":  # any object: non-strict, so every property is allowed
            return c.compile_json_schema(
                '{"type":"object"}', any_whitespace=spec.option("any_whitespace", True),
                strict_mode=False,
            )
        if kind == "regex":
            return c.compile_regex(data)
        if kind == "ebnf":
            return c.compile_grammar(data, root_rule_name=spec.option("root", "root"))
        if kind == "choice":
            body = " | ".join(json.dumps(s, ensure_ascii=False) for s in data)
            return c.compile_grammar(f"root ::= {body}")
        if kind == "structural_tag":
            return c.compile_structural_tag(xgrammar_structural_tag(data))
        raise ValueError(f"xgrammar engine: unknown spec kind {kind!r}")

    def serialize(self, compiled: Any) -> str:
        return str(compiled.serialize_json())

    def deserialize(self, text: str) -> Any:
        return self._xgr.CompiledGrammar.deserialize_json(text, self.tokenizer_info)

    def nbytes(self, compiled: Any) -> int:
        return int(compiled.memory_size_bytes)

    def new_matcher(self, compiled: Any) -> XGrammarMatcher:
        return XGrammarMatcher(self._xgr.GrammarMatcher(compiled))

    def fill_batch(
        self, matchers: Sequence[Matcher], bitmask: Any, rows: Sequence[int]
    ) -> None:
        raw = [m._m for m in matchers]  # type: ignore[attr-defined]
        with self._batch_lock:
            self._batch.batch_fill_next_token_bitmask(raw, bitmask, list(rows))


def xgrammar_structural_tag(data: dict[str, Any]) -> dict[str, Any]:
    """Our structural-tag payload in xgrammar's ``triggered_tags`` format."""
    return {
        "type": "structural_tag",
        "format": {
            "type": "triggered_tags",
            "triggers": list(data["triggers"]),
            "tags": [
                {
                    "type": "tag",
                    "begin": t["begin"],
                    "content": {"type": "json_schema", "json_schema": t["schema"]},
                    "end": t["end"],
                }
                for t in data["tags"]
            ],
        },
    }
