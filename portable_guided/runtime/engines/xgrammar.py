"""The xgrammar engine (the default), and the conversion of a :class:`TokenizerInfo` into an
``xgrammar.TokenizerInfo``."""

from __future__ import annotations

import json
import os
import re
import threading
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from ...json_schema.lowering import engine_schema_text, refuse_unsatisfiable
from ...json_schema.refusals import unsound, xgrammar_escapes, xgrammar_unsupported
from ...json_schema.strict import xgrammar_open_schema
from ...json_schema.xgrammar_forms import (
    declared_required,
    false_refs_inlined,
    structured_values_text,
    typed_values,
    xgrammar_exact_strings,
)
from ..specs import GrammarSpec
from ..xgrammar_exact import exact_placeholders, substitute_exact
from .base import (
    EmptyLanguage,
    Engine,
    Matcher,
    UnsupportedSpec,
    foreign_matcher,
    package_version,
)
from .xgrammar_free_names import share_free_name_tails
from .xgrammar_surrogates import ANY_DOT, exclude_regex_surrogates, exclude_surrogates

if TYPE_CHECKING:
    import xgrammar

    from ..tokenizer_info import TokenizerInfo

__all__ = [
    "COMPILER_CACHE_BYTES",
    "XGrammarEngine",
    "XGrammarMatcher",
    "json_char_rule_fixed",
    "tokenizer",
    "tokenizer_from_payload",
    "tokenizer_payload",
    "xgrammar_structural_tag",
]

_PAYLOAD_KIND = "xgrammar-json"

#: Memory bound of each engine's ``xgrammar.GrammarCompiler`` cache (per process: the
#: runtime's and each compile worker's engine; it grows only with what the process
#: compiles). Its gain comes from token masks shared between grammars: every state of a
#: string's ``maxLength``, a format's pattern, an open object's names. A bound of 16 MiB held
#: the JSON sub-grammars but not those (a ``maxLength: 255`` string is about 13 MiB of
#: masks): the second schema with an email compiled in 310 ms at 16 MiB, 4 ms at 512
#: (``bench/bench_compiler_cache.py``). xgrammar gives a third of the bound to those shared
#: rule masks (the rest to whole grammars), evicted least recently used: at vLLM's 512 MiB
#: (``VLLM_XGRAMMAR_CACHE_MB``) that third (170 MiB) is less than the start-up prewarm puts
#: there at a 129k vocabulary (about 320 MiB in all), so its longest length bounds evicted
#: its open-object names (Github_easy o14464 then compiled in 514 ms, 42 ms at 1 GiB;
#: ``bench/bench_prewarm.py``). 1 GiB holds the prewarm with room to spare at vocabularies
#: up to about 150k; the memory used is what was compiled, not the bound.
COMPILER_CACHE_BYTES = 1 << 30


def tokenizer(info: TokenizerInfo) -> xgrammar.TokenizerInfo:
    """The ``xgrammar.TokenizerInfo`` for ``info`` (built once, cached on ``info``)."""
    return info.cached("xgrammar.tokenizer", lambda: _build_tokenizer(info))


def tokenizer_payload(info: TokenizerInfo) -> tuple[str, str]:
    """A picklable description of ``info``'s xgrammar tokenizer (its serialized JSON), from
    which :func:`tokenizer_from_payload` rebuilds it in a compile worker."""
    return (_PAYLOAD_KIND, str(tokenizer(info).serialize_json()))


def tokenizer_from_payload(payload: tuple[str, Any]) -> xgrammar.TokenizerInfo:
    """Rebuild an ``xgrammar.TokenizerInfo`` from :func:`tokenizer_payload`'s result."""
    import xgrammar as xgr

    kind = payload[0] if isinstance(payload, tuple) and len(payload) == 2 else None
    if kind != _PAYLOAD_KIND:
        raise ValueError(f"not an xgrammar tokenizer payload: expected ({_PAYLOAD_KIND!r}, "
                         f"text), got {type(payload).__name__} of kind {kind!r}")
    return xgr.TokenizerInfo.deserialize_json(payload[1])


def _build_tokenizer(info: TokenizerInfo) -> xgrammar.TokenizerInfo:
    import xgrammar as xgr

    stops = list(info.stop_token_ids)
    if info.hf_tokenizer is not None:
        return xgr.TokenizerInfo.from_huggingface(
            info.hf_tokenizer, vocab_size=info.vocab_size, stop_token_ids=stops)
    t = info.tiktoken
    if t is None:
        raise ValueError(f"{info!r} has neither a Hugging Face tokenizer nor a tiktoken "
                         "vocabulary")
    # Raw byte strings indexed by id (ids no token uses stay empty).
    vocab: list[bytes] = [b""] * info.tokenizer_vocab_size
    for token, rank in t.ranks.items():
        vocab[rank] = token
    for text, tid in t.special_tokens.items():
        vocab[tid] = text.encode()
    return xgr.TokenizerInfo(
        vocab, xgr.VocabType.RAW, vocab_size=info.vocab_size, stop_token_ids=stops)


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

    def __init__(self, tokenizer_info: xgrammar.TokenizerInfo, *, fill_threads: int = 1,
                 compile_threads: int = 1) -> None:
        import xgrammar as xgr

        self._xgr = xgr
        self.tokenizer_info = tokenizer_info
        self.vocab_size = int(tokenizer_info.vocab_size)
        self.stop_token_ids = frozenset(int(t) for t in tokenizer_info.stop_token_ids)
        # The compiler's cache also shares token masks between grammars (the sub-grammars of
        # JSON strings, numbers, whitespace ...): a new small schema compiled in 0.4 ms
        # instead of 3.7 ms (SmolLM2, bench/bench_vllm.py --cold). Bounded, since our own
        # caches above hold the compiled grammars.
        self._compiler = xgr.GrammarCompiler(tokenizer_info, max_threads=compile_threads,
                                             cache_enabled=True,
                                             cache_limit_bytes=COMPILER_CACHE_BYTES)
        self._batch = xgr.BatchGrammarMatcher(max_threads=max(1, int(fill_threads)))
        # One batch fill at a time per engine: the batch matcher owns one thread pool.
        self._batch_lock = threading.Lock()
        self._chunk = xgr.BatchGrammarMatcher(max_threads=1)  # cheap steps (fill_chunk)
        self._chunk_lock = threading.Lock()

    @staticmethod
    def version() -> str:
        return package_version("xgrammar")

    @classmethod
    def create(cls, info: TokenizerInfo, *, fill_threads: int = 1) -> XGrammarEngine:
        # A compile in this process (one at a time, mostly: compile_race, or no limit) may
        # use every core, as vLLM's own compiler does; a worker compiles on one thread, the
        # pool's size being the parallelism there. Github_hard, 2 cores: 1.4x less time in all.
        return cls(tokenizer(info), fill_threads=fill_threads,
                   compile_threads=min(8, os.cpu_count() or 1))

    @staticmethod
    def tokenizer_payload(info: TokenizerInfo) -> tuple[str, str]:
        return tokenizer_payload(info)  # the module's function (methods skip class scope)

    @classmethod
    def from_payload(cls, payload: Any, *, fill_threads: int = 1) -> XGrammarEngine:
        return cls(tokenizer_from_payload(payload), fill_threads=fill_threads)

    def compile(self, spec: GrammarSpec) -> Any:
        c = self._compiler
        kind, data = spec.kind, spec.payload
        if kind == "json_schema":
            return self.compile_prepared(self.prepare(spec))
        if kind == "any_json":  # any object: non-strict, so every property is allowed
            return self._compile_text(str(self._xgr.Grammar.from_json_schema(
                '{"type":"object"}', any_whitespace=spec.option("any_whitespace", True),
                strict_mode=False)))
        if kind == "regex":
            return c.compile_regex(exclude_regex_surrogates(data, dot=ANY_DOT))
        if kind == "ebnf":
            return c.compile_grammar(data, root_rule_name=spec.option("root", "root"))
        if kind == "choice":
            body = " | ".join(json.dumps(s, ensure_ascii=False) for s in data)
            return c.compile_grammar(f"root ::= {body}")
        if kind == "structural_tag":
            return self._compile_structural_tag(data)
        if kind == "xgrammar_structural_tag":  # xgrammar's own format, as written
            return c.compile_structural_tag(spec.text)
        raise ValueError(f"xgrammar engine: unknown spec kind {kind!r}")

    def prepare(self, spec: GrammarSpec) -> tuple[str, bool]:
        """What :meth:`compile` hands xgrammar for a ``json_schema`` spec, every check
        passed: ``(schema text, any_whitespace)`` for :meth:`compile_prepared`. A compile
        worker sends it back with a fast compile, so that the parent's recompile skips the
        lowering and the checks (Python holding the GIL) the worker already ran."""
        # One language on every engine (json_schema.refusals): strictness is in the schema text,
        # never xgrammar's strict_mode (which also forbids array items that no `items`
        # declares), and keywords xgrammar would ignore make it refuse. The schema is
        # lowered first (exact rewrites, json_schema.lowering).
        text = engine_schema_text(spec.engine_schema_text())
        refuse_unsatisfiable(text)
        if spec.option("any_whitespace", True):
            text = structured_values_text(text)
        schema = json.loads(text)
        declared = false_refs_inlined(typed_values(declared_required(schema)))
        if declared is not schema:
            schema, text = declared, json.dumps(declared)
        exact, unscanned = xgrammar_exact_strings(schema)
        if exact is not schema:
            schema, text = exact, json.dumps(exact)
        problems = [*unsound(schema), *xgrammar_escapes(schema), *xgrammar_unsupported(schema),
                    *(f"pattern {p[:40]!r} could not be scanned" for p in unscanned)]
        if problems:
            more = f" (and {len(problems) - 3} more)" if len(problems) > 3 else ""
            raise UnsupportedSpec("; ".join(problems[:3]) + more)
        return text, bool(spec.option("any_whitespace", True))

    def compile_prepared(self, prepared: tuple[str, bool]) -> Any:
        """Compile what :meth:`prepare` returned (no check again)."""
        return self._compile_text(self.prepared_ebnf(prepared))

    def prepared_ebnf(self, prepared: tuple[str, bool]) -> str:
        """The EBNF text :meth:`compile_prepared` compiles (before the surrogates step of
        every compile) for what :meth:`prepare` returned: xgrammar's grammar of the schema
        with the ways out of declared names shared (xgrammar_free_names), corrected where
        its rules are narrower or wider than the schema (:meth:`_compile_corrected`)."""
        text, any_whitespace = prepared
        exact: dict[str, str] = {}
        marked = exact_placeholders(text, exact)
        grammar = self._xgr.Grammar.from_json_schema(marked, any_whitespace=any_whitespace,
                                                     strict_mode=False)
        ebnf = share_free_name_tails(str(grammar))
        return _corrected(ebnf, exact) if exact or _native_lengths(text) else ebnf

    def _compile_text(self, ebnf: str) -> Any:
        # Every grammar is compiled from its text, with no UTF-16 surrogate in any negated
        # class or regex dot (xgrammar_surrogates): about 4% more compile time on Github_hard
        # than xgrammar's compile of the schema itself.
        return self._compiler.compile_grammar(self._xgr.Grammar.from_ebnf(
            exclude_surrogates(ebnf)))

    def _compile_corrected(self, ebnf: str, exact: dict[str, str]) -> Any:
        """Compile xgrammar's grammar text corrected where its rules are narrower or wider
        than the schema: number ranges (at most 6 fraction digits there) and short
        minLength strings (no escapes there) become our exact rules (xgrammar_exact), and
        the character rule of other length bounds (a pattern up to 128 by now), which lets
        raw control characters in, is fixed."""
        return self._compile_text(_corrected(ebnf, exact))

    def _compile_structural_tag(self, data: dict[str, Any]) -> Any:
        """Each tag's schema goes through :meth:`prepare` as a ``json_schema`` spec's does
        (lowered, checked, in the forms xgrammar builds exactly): a tool call's arguments
        follow the same language as a response format. A tag xgrammar cannot enforce
        refuses the whole spec (``auto`` then tries the next engine)."""
        tags = []
        lengths = False
        exact: dict[str, str] = {}
        for i, tag in enumerate(data["tags"]):
            try:
                text, _ = self.prepare(GrammarSpec.json_schema(tag["schema"]))
            except (UnsupportedSpec, EmptyLanguage) as exc:
                raise UnsupportedSpec(f"tag {i} ({tag['begin']!r}): {exc}") from exc
            lengths = lengths or _native_lengths(text)
            text = exact_placeholders(text, exact)
            # (xgrammar compiles a tag's schema in strict mode: its defaults written out)
            tags.append({**tag, "schema": xgrammar_open_schema(json.loads(text))})
        structural = xgrammar_structural_tag({"tags": tags, "triggers": data["triggers"]})
        ebnf = share_free_name_tails(str(self._xgr.Grammar.from_structural_tag(
            json.dumps(structural))))
        if not lengths and not exact:
            return self._compile_text(ebnf)
        return self._compile_corrected(ebnf, exact)

    def compile_raw(self, spec: GrammarSpec) -> Any:
        if spec.kind != "json_schema":
            raise UnsupportedSpec(f"raw compile takes json_schema specs, got {spec.kind!r}")
        # vLLM's xgrammar backend: xgrammar's default strict_mode (True).
        return self._compiler.compile_json_schema(
            spec.text, any_whitespace=spec.option("any_whitespace", True))

    def serialize(self, compiled: Any) -> str:
        return str(compiled.serialize_json())

    def deserialize(self, text: str) -> Any:
        return self._xgr.CompiledGrammar.deserialize_json(text, self.tokenizer_info)

    def nbytes(self, compiled: Any) -> int:
        return int(compiled.memory_size_bytes)

    def new_matcher(self, compiled: Any) -> XGrammarMatcher:
        return XGrammarMatcher(self._xgr.GrammarMatcher(compiled))

    def forget(self, compiled: Any) -> None:
        # The compiler's cache would hand the same object back for the same spec.
        self._compiler.clear_cache()

    def fill_batch(
        self, matchers: Sequence[Matcher], bitmask: Any, rows: Sequence[int]
    ) -> None:
        self._fill_with(self._batch, self._batch_lock, matchers, bitmask, rows)

    def fill_chunk(
        self, matchers: Sequence[Matcher], bitmask: Any, rows: Sequence[int]
    ) -> None:
        self._fill_with(self._chunk, self._chunk_lock, matchers, bitmask, rows)

    def _fill_with(self, batch: Any, lock: threading.Lock, matchers: Sequence[Matcher],
                   bitmask: Any, rows: Sequence[int]) -> None:
        raw = [m._m if isinstance(m, XGrammarMatcher) else foreign_matcher(self.name, m)
               for m in matchers]
        with lock:
            batch.batch_fill_next_token_bitmask(raw, bitmask, list(rows))


def _corrected(ebnf: str, exact: dict[str, str]) -> str:
    """xgrammar's grammar text with our exact rules in place (:meth:`XGrammarEngine.
    _compile_corrected`)."""
    return substitute_exact(json_char_rule_fixed(ebnf), exact)


def _native_lengths(text: str) -> bool:
    """Whether a prepared schema text may hold ``minLength``/``maxLength`` (xgrammar builds
    those with its own rule: see :meth:`XGrammarEngine._compile_corrected`)."""
    return '"minLength"' in text or '"maxLength"' in text


#: The rule xgrammar 0.2.8 writes for a character of a string with ``minLength`` or
#: ``maxLength`` (``root_characters ::= ...``): it leaves out only the quote, the backslash,
#: carriage return and newline, so a raw tab or any other U+0000-U+001F got into the string.
_LENGTH_CHAR_RULE = re.compile(r'^(\S+ ::= )\(\(\[\^\\"\\\\\\r\\n\]\)\)$', re.MULTILINE)
#: A negated class in a rule of an xgrammar EBNF text (its ``Regex(...)`` rules aside).
_NEGATED_CLASS = re.compile(r'^(?!.*Regex\().*\[\^(?![^\]]*\\0-\\x1f)', re.MULTILINE)


def json_char_rule_fixed(ebnf: str) -> str:
    """xgrammar's EBNF text of a JSON schema with every length-bounded string's character
    rule excluding U+0000-U+001F as JSON does (``[^\\0-\\x1f\"\\\\]``). Raises
    :class:`UnsupportedSpec` when another negated class is left that does not exclude them
    (a form this xgrammar version writes that was not foreseen: refused, not guessed)."""
    fixed = _LENGTH_CHAR_RULE.sub(lambda m: m.group(1) + '(([^\\0-\\x1f\\"\\\\]))', ebnf)
    left = _NEGATED_CLASS.search(fixed)
    if left is not None:
        raise UnsupportedSpec(f"xgrammar wrote a string rule that may let raw control "
                              f"characters in, not recognized: {left.group(0)[:80]!r}")
    return fixed


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
