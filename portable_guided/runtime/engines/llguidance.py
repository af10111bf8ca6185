"""The llguidance engine, and the conversion of a :class:`TokenizerInfo` into an
``llguidance.LLTokenizer``."""

from __future__ import annotations

import json
import threading
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from ...json_schema.lowering import engine_schema_text, refuse_unsatisfiable
from ...json_schema.numbers import llguidance_exact_numbers
from ...json_schema.refusals import llguidance_unsupported, unsound
from ..specs import GrammarSpec
from .base import EmptyLanguage, Engine, Matcher, UnsupportedSpec, foreign_matcher, package_version

if TYPE_CHECKING:
    import llguidance

    from ..tokenizer_info import TokenizerInfo

__all__ = [
    "LLGuidanceEngine",
    "LLGuidanceMatcher",
    "bitmask_pointer",
    "tokenizer",
    "tokenizer_from_payload",
    "tokenizer_payload",
]


def tokenizer(info: TokenizerInfo) -> llguidance.LLTokenizer:
    """The ``llguidance.LLTokenizer`` for ``info`` (built once, cached on ``info``)."""
    return info.cached("llguidance.tokenizer",
                       lambda: tokenizer_from_payload(tokenizer_payload(info)))


def tokenizer_payload(info: TokenizerInfo) -> tuple[str, tuple[Any, ...]]:
    """A picklable description of ``info``'s tokenizer, from which
    :func:`tokenizer_from_payload` builds the ``LLTokenizer`` (in this process or a compile
    worker): ``("hf-json", (tokenizer.json text, n_vocab, stops))`` or
    ``("tiktoken", (ranks, special tokens, pattern, n_vocab, stops))``."""
    stops = list(info.stop_token_ids)
    text = info.hf_tokenizer_json
    if text is not None:
        return ("hf-json", (text, info.vocab_size, stops))
    t = info.tiktoken
    if t is None:
        raise ValueError(f"{info!r} has neither a Hugging Face tokenizer nor a tiktoken "
                         "vocabulary")
    return ("tiktoken", (dict(t.ranks), dict(t.special_tokens), t.pattern, info.vocab_size,
                         stops))


def tokenizer_from_payload(payload: tuple[str, Any]) -> llguidance.LLTokenizer:
    """Build an ``llguidance.LLTokenizer`` from :func:`tokenizer_payload`'s result."""
    import llguidance as llg

    kind = payload[0] if isinstance(payload, tuple) and len(payload) == 2 else None
    if kind == "hf-json":
        text, n_vocab, stops = payload[1]
        return llg.LLTokenizer(text, n_vocab=n_vocab, eos_token=stops)
    if kind == "tiktoken":
        ranks, special, pattern, n_vocab, stops = payload[1]
        return llg.LLTokenizer.from_tiktoken(
            encoder=ranks, special_tokens=special, pattern=pattern,
            eos_token=stops, n_vocab=n_vocab,
        )
    raise ValueError(f"not an llguidance tokenizer payload: expected ('hf-json' or "
                     f"'tiktoken', data), got {type(payload).__name__} of kind {kind!r}")


# The last NumPy bitmask seen and its (address, rows, words): engines fill the same buffer
# step after step, and reading an array's address costs more than computing a mask row.
# Holding the reference keeps the address valid (NumPy refuses to resize a referenced array).
_last_numpy: tuple[Any, int, int, int] = (None, 0, 0, 0)


def bitmask_pointer(bitmask: Any) -> tuple[int, int, int]:
    """(address, rows, words) of a C-contiguous int32 CPU bitmask (NumPy or Torch)."""
    global _last_numpy
    last = _last_numpy
    if last[0] is bitmask:
        return last[1], last[2], last[3]
    shape = tuple(bitmask.shape)
    if len(shape) != 2:
        raise ValueError(f"bitmask must be 2-D (rows, words), got shape {shape}")
    if hasattr(bitmask, "ctypes"):  # NumPy
        if str(bitmask.dtype) != "int32" or not bitmask.flags["C_CONTIGUOUS"]:
            raise ValueError(
                f"bitmask must be C-contiguous int32, got {bitmask.dtype} "
                f"contiguous={bitmask.flags['C_CONTIGUOUS']}"
            )
        _last_numpy = (bitmask, int(bitmask.ctypes.data), shape[0], shape[1])
        return _last_numpy[1], shape[0], shape[1]
    if hasattr(bitmask, "data_ptr"):  # Torch
        if str(bitmask.dtype) != "torch.int32" or not bitmask.is_contiguous() or (
            bitmask.device.type != "cpu"
        ):
            raise ValueError(
                f"bitmask must be a contiguous int32 CPU tensor, got {bitmask.dtype} on "
                f"{bitmask.device}"
            )
        return int(bitmask.data_ptr()), shape[0], shape[1]
    raise TypeError(f"bitmask must be a NumPy array or a Torch tensor, got {type(bitmask)}")


class LLGuidanceMatcher(Matcher):
    """A request's ``llguidance.LLMatcher``.

    llguidance enters a permanent error state on a rejected token, so tokens go through
    ``try_consume_tokens`` (which leaves the state unchanged on rejection); a stop token is
    accepted when the grammar is in an accepting state.
    """

    __slots__ = ("_m", "_stopped", "_stops", "_vocab_size")

    def __init__(self, matcher: Any, stop_token_ids: frozenset[int], vocab_size: int) -> None:
        self._m = matcher
        self._stops = stop_token_ids
        self._stopped = False
        self._vocab_size = vocab_size

    def accept(self, token_id: int) -> bool:
        if self._stopped:
            return False
        if token_id in self._stops:
            if self._m.is_accepting():
                self._stopped = True
                return True
            return False
        # An id outside the vocabulary puts the LLMatcher in a permanent error state.
        if not 0 <= token_id < self._vocab_size:
            return False
        return bool(self._m.try_consume_tokens([token_id]) == 1)

    def error(self) -> str | None:
        return str(self._m.get_error()) if self._m.is_error() else None

    def rollback(self, n: int) -> None:
        if n and self._stopped:
            self._stopped = False
            n -= 1
        if n and not self._m.rollback(n):
            raise RuntimeError(f"llguidance rollback of {n} failed: {self._m.get_error()}")

    def fill(self, bitmask: Any, row: int) -> None:
        ptr, rows, words = bitmask_pointer(bitmask)
        # The library writes through a raw pointer: a bad row would write outside the array.
        if isinstance(row, bool) or not 0 <= row < rows:
            raise ValueError(f"row {row!r} out of range for a bitmask of {rows} rows")
        if words * 32 < self._vocab_size:
            raise ValueError(f"bitmask rows of {words} words cover {words * 32} tokens, fewer "
                             f"than the vocabulary's {self._vocab_size}")
        self._m.unsafe_compute_mask_ptr(ptr + row * words * 4, words * 4)

    def is_terminated(self) -> bool:
        return self._stopped

    def jump_forward(self) -> str:
        data = bytes(self._m.compute_ff_bytes())
        for cut in range(4):  # drop an incomplete UTF-8 sequence at the end
            try:
                return data[: len(data) - cut].decode("utf-8")
            except UnicodeDecodeError:
                continue
        return ""


class LLGuidanceEngine(Engine):
    """Compiles specs to llguidance grammars; a compiled grammar is a validated template
    matcher that new requests deep-copy."""

    name = "llguidance"
    fill_releases_gil = True  # LLMatcher.unsafe_compute_mask_ptr runs without the GIL
    matcher_errors = True  # e.g. the lexer running past its limits on a token

    def __init__(self, lltokenizer: llguidance.LLTokenizer, *, fill_threads: int = 1) -> None:
        import llguidance as llg

        self._llg = llg
        self.tokenizer = lltokenizer
        self._stops = frozenset(int(t) for t in lltokenizer.eos_tokens)
        self.vocab_size = int(lltokenizer.vocab_size)
        self.stop_token_ids = self._stops
        self._executor = llg.LLExecutor(max(1, int(fill_threads)))
        self._batch_lock = threading.Lock()  # one batch fill at a time per executor
        self._chunk_executor = llg.LLExecutor(1)  # cheap steps (fill_chunk)
        self._chunk_lock = threading.Lock()

    @staticmethod
    def version() -> str:
        return package_version("llguidance")

    @classmethod
    def create(cls, info: TokenizerInfo, *, fill_threads: int = 1) -> LLGuidanceEngine:
        return cls(tokenizer(info), fill_threads=fill_threads)

    @staticmethod
    def tokenizer_payload(info: TokenizerInfo) -> tuple[str, tuple[Any, ...]]:
        return tokenizer_payload(info)  # the module's function (methods skip class scope)

    @classmethod
    def from_payload(cls, payload: Any, *, fill_threads: int = 1) -> LLGuidanceEngine:
        return cls(tokenizer_from_payload(payload), fill_threads=fill_threads)

    def grammar_text(self, spec: GrammarSpec) -> str:
        """The llguidance grammar (JSON text) for ``spec``."""
        L = self._llg.LLMatcher
        kind, data = spec.kind, spec.payload
        # coerce_one_of reads oneOf as anyOf: exact only on disjoint branches, so a oneOf
        # whose branches may overlap is refused first (json_schema.refusals.unsound).
        json_opts = {"whitespace_flexible": bool(spec.option("any_whitespace", True)),
                     "coerce_one_of": True}
        if kind == "json_schema":
            text = _checked_schema_text(spec)
            return str(L.grammar_from_json_schema(text, defaults=json_opts))
        if kind == "any_json":
            return str(L.grammar_from_json_schema('{"type":"object"}', defaults=json_opts))
        if kind == "regex":
            return str(L.grammar_from_regex(data))
        if kind == "ebnf":
            root = spec.option("root", "root")
            text = data if root == "root" else data + f"\nroot ::= {root}\n"
            return str(L.grammar_from_lark(_gbnf_to_lark(text)))
        if kind == "choice":
            body = " | ".join(json.dumps(s, ensure_ascii=False) for s in data)
            return str(L.grammar_from_lark(f"start: {body}"))
        if kind == "structural_tag":
            tags = []
            for i, t in enumerate(data["tags"]):
                # Each tag's schema as a json_schema spec's: the same language for a tool
                # call's arguments as for a response format.
                try:
                    schema = json.loads(_checked_schema_text(GrammarSpec.json_schema(
                        t["schema"])))
                except (UnsupportedSpec, EmptyLanguage) as exc:
                    raise UnsupportedSpec(f"tag {i} ({t['begin']!r}): {exc}") from exc
                schema["x-guidance"] = json_opts
                trigger = max((tr for tr in data["triggers"] if t["begin"].startswith(tr)), key=len)
                tags.append(self._llg.StructTag(
                    trigger=trigger, begin=t["begin"], grammar=schema, end=t["end"]))
            return str(L.grammar_from_lark(self._llg.StructTag.to_grammar(tags)))
        if kind == "xgrammar_structural_tag":
            raise UnsupportedSpec("xgrammar's own structural-tag format is compiled by "
                                  "xgrammar only")
        raise UnsupportedSpec(f"llguidance engine: unknown spec kind {kind!r}")

    def compile(self, spec: GrammarSpec) -> Any:
        return self._load(self.grammar_text(spec))

    def _load(self, grammar: str) -> Any:
        matcher = self._llg.LLMatcher(self.tokenizer, grammar, log_level=0)
        if matcher.is_error():
            raise ValueError(matcher.get_error())
        return _Compiled(grammar, matcher)

    def compile_raw(self, spec: GrammarSpec) -> Any:
        if spec.kind != "json_schema":
            raise UnsupportedSpec(f"raw compile takes json_schema specs, got {spec.kind!r}")
        # vLLM's guidance backend: llguidance's own defaults, flexible whitespace.
        return self._load(str(self._llg.LLMatcher.grammar_from_json_schema(
            spec.text, defaults={"whitespace_flexible": bool(spec.option("any_whitespace",
                                                                          True))})))

    def serialize(self, compiled: Any) -> str:
        return str(compiled.grammar)

    def deserialize(self, text: str) -> Any:
        return self._load(text)

    def nbytes(self, compiled: Any) -> int:
        # llguidance does not report its memory; the grammar text plus a fixed parser
        # overhead is a stable estimate for the byte-bounded cache.
        return len(compiled.grammar) * 4 + 65536

    def new_matcher(self, compiled: Any) -> LLGuidanceMatcher:
        return LLGuidanceMatcher(compiled.template.deep_copy(), self._stops, self.vocab_size)

    def fill_batch(
        self, matchers: Sequence[Matcher], bitmask: Any, rows: Sequence[int]
    ) -> None:
        self._fill_with(self._executor, self._batch_lock, matchers, bitmask, rows)

    def fill_chunk(
        self, matchers: Sequence[Matcher], bitmask: Any, rows: Sequence[int]
    ) -> None:
        self._fill_with(self._chunk_executor, self._chunk_lock, matchers, bitmask, rows)

    def _fill_with(self, executor: Any, lock: threading.Lock, matchers: Sequence[Matcher],
                   bitmask: Any, rows: Sequence[int]) -> None:
        ptr, nrows, words = bitmask_pointer(bitmask)
        pairs = [(m._m if isinstance(m, LLGuidanceMatcher) else foreign_matcher(self.name, m),
                  int(r)) for m, r in zip(matchers, rows)]
        bad = [r for _, r in pairs if not 0 <= r < nrows]
        if bad:  # the library writes through a raw pointer
            raise ValueError(f"rows {bad[:5]} out of range for a bitmask of {nrows} rows")
        if words * 32 < self.vocab_size:
            raise ValueError(f"bitmask rows of {words} words cover {words * 32} tokens, fewer "
                             f"than the vocabulary's {self.vocab_size}")
        with lock:
            executor.unsafe_compute_mask_ptr(pairs, ptr, words * 4, nrows)


class _Compiled:
    __slots__ = ("grammar", "template")

    def __init__(self, grammar: str, template: Any) -> None:
        self.grammar = grammar
        self.template = template


def _checked_schema_text(spec: GrammarSpec) -> str:
    """The lowered schema text llguidance compiles for the ``json_schema`` ``spec``; raises
    :class:`UnsupportedSpec` for what it cannot enforce exactly, ``EmptyLanguage`` for a
    schema no value satisfies."""
    text = engine_schema_text(spec.engine_schema_text())
    refuse_unsatisfiable(text)
    schema = json.loads(text)
    problems = [*unsound(schema), *llguidance_unsupported(schema, text)]
    if problems:
        more = f" (and {len(problems) - 3} more)" if len(problems) > 3 else ""
        raise UnsupportedSpec("; ".join(problems[:3]) + more)
    return llguidance_exact_numbers(schema, text)


def _gbnf_to_lark(text: str) -> str:
    from llguidance.gbnf_to_lark import gbnf_to_lark

    return str(gbnf_to_lark(text))
