"""Soundness by generation: of the texts a mask lets a model write, does any fail the
schema's own validator?

The runtime promises that a model constrained by a ``GrammarSpec.json_schema`` mask can never
write JSON the schema rejects. The suite and MaskBench harnesses check instances someone
else wrote; this one writes its own, as a model would: a random walk fills the mask, picks an
allowed token (biased toward closing brackets, quotes, commas and short tokens, more so as
the walk grows, so walks end), accepts it, and stops when the stop token is allowed and
picked. The finished text is parsed and validated with ``jsonschema`` for the schema's
declared draft (2020-12 without ``$schema``), formats asserted. An invalid text is a
failure; a walk that reaches the step cap is "unfinished" (counted, not a failure).

Sources: the official JSON Schema Test Suite of every draft (:func:`suite_items`),
MaskBench (:func:`maskbench_items`) and random small schemas (:func:`schema_strategy`,
:func:`hypothesis_items`, needing ``hypothesis``). :func:`cross_accept` is the metamorphic
check: a schema read the same way by two drafts (:func:`same_reading`) must accept, under
each ``$schema``, the walks written under the other.

Used by ``bench/bench_generation.py`` (full runs) and ``tests/harness/test_generation.py``.

>>> with MaskWalker(load_tokenizer_info("smollm2"), "llguidance") as walker:  # doctest: +SKIP
...     result = run_generation([{"id": "x", "schema": {"type": "integer"}}], walker)
>>> result.summary()["failures"]                                             # doctest: +SKIP
0
"""

from __future__ import annotations

import json
import os
import re
import warnings
import zlib
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from ..runtime.errors import (
    GrammarCompileError,
    GrammarEmptyLanguage,
    GrammarError,
    GrammarSpecError,
    GrammarTimeout,
)
from ..runtime.runtime import GrammarRuntime
from ..runtime.specs import GrammarSpec
from ..runtime.tokenizer_info import TokenizerInfo

__all__ = [
    "DRAFTS",
    "Failure",
    "GenerationResult",
    "MaskWalker",
    "Walk",
    "check_text",
    "cross_accept",
    "draft_of",
    "hypothesis_items",
    "maskbench_items",
    "run_generation",
    "same_reading",
    "schema_strategy",
    "suite_folders",
    "suite_items",
    "unchecked_formats",
    "validator_for",
    "with_draft",
]

#: The ``$schema`` URI of each draft, by the suite's folder name.
DRAFTS: dict[str, str] = {
    "draft4": "http://json-schema.org/draft-04/schema#",
    "draft6": "http://json-schema.org/draft-06/schema#",
    "draft7": "http://json-schema.org/draft-07/schema#",
    "draft2019-09": "https://json-schema.org/draft/2019-09/schema",
    "draft2020-12": "https://json-schema.org/draft/2020-12/schema",
}

#: The suite's remote references point here (a server the suite's own runner starts); the
#: runtime must refuse them (it never fetches), so no walk is possible.
_REMOTE = "localhost:1234"

# Token classes for the walk's bias, in the order a token is assigned to the first that fits.
_CLASSES = ("close", "short", "other", "open", "space")


# -- results ---------------------------------------------------------------------------------
@dataclass
class Failure:
    """A text the mask let a model write that the schema's validator rejects."""

    id: str
    engine: str
    text: str
    error: str
    #: The failing keyword (``format``, ``maximum``...; ``json`` for text that does not
    #: parse, ``utf-8`` for bytes that do not decode), for grouping by cause.
    keyword: str
    #: The draft the schema declares (``$schema``), or 2020-12's when it declares none.
    draft: str
    #: The format whose check failed (``keyword == "format"``), else "".
    format: str = ""
    #: Why the failure may not be the mask's: the validator decides one of the suite's own
    #: instances of this group against the suite's label, or the text is valid when
    #: numbers are read exactly; or a fact about the text (it repeats a property name).
    note: str = ""
    #: Whether the note says the validator, not the mask, is wrong about this text (a
    #: defect of ``jsonschema`` or of binary floats): such a failure is counted apart.
    validator_suspect: bool = False


@dataclass
class GenerationResult:
    """Counts and findings of :func:`run_generation` on one engine."""

    engine: str
    schemas: int = 0
    compiled: int = 0
    refused: int = 0
    empty: int = 0
    timeouts: int = 0
    #: Groups needing a remote ``$ref``: refused (as they must be) or compiled (listed).
    remote_refused: int = 0
    remote_compiled: list[str] = field(default_factory=list)
    walks_finished: int = 0
    walks_unfinished: int = 0
    tokens: int = 0
    failures: list[Failure] = field(default_factory=list)
    #: A mask that allowed no token before the grammar ended (``{"id", "text"}``).
    dead_ends: list[dict[str, Any]] = field(default_factory=list)
    #: A token the mask allowed that ``accept`` then rejected (``{"id", "text", "token"}``).
    mask_accept_mismatches: list[dict[str, Any]] = field(default_factory=list)
    #: Walks cut short because the engine failed on the request (``{"id", "text",
    #: "error"}``): the runtime then allows only the stop token and marks the request
    #: failed, so the cut-off text is the runtime's documented failure, not a vouched text.
    engine_failures: list[dict[str, Any]] = field(default_factory=list)
    #: Texts the validator could not decide (an unresolvable ``$ref``, deep recursion).
    validator_errors: list[dict[str, Any]] = field(default_factory=list)
    #: Valid texts with a repeated property name (the validator sees the last one only):
    #: ``{"id", "text", "first_wins_error"}``, the error a reader keeping the first
    #: occurrence would see ("" if none).
    duplicate_keys: list[dict[str, Any]] = field(default_factory=list)
    #: Formats used by compiled schemas that the installed ``jsonschema`` does not assert
    #: (a missing package such as rfc3339-validator): failures of these go unseen.
    formats_unchecked: Counter[str] = field(default_factory=Counter)
    #: Per schema: ``{"id", "status", "finished", "unfinished", "failures"}``.
    per_schema: list[dict[str, Any]] = field(default_factory=list)

    def summary(self) -> dict[str, Any]:
        """The counts (no texts): what a results file's headline gives."""
        return {
            "engine": self.engine, "schemas": self.schemas, "compiled": self.compiled,
            "refused": self.refused, "empty": self.empty, "timeouts": self.timeouts,
            "remote_refused": self.remote_refused, "remote_compiled": len(self.remote_compiled),
            "walks_finished": self.walks_finished, "walks_unfinished": self.walks_unfinished,
            "tokens": self.tokens, "failures": len(self.failures),
            # The target: texts the validator rejects and is not suspected of misjudging.
            "invalid_texts": sum(not f.validator_suspect for f in self.failures),
            "validator_suspect_failures": sum(f.validator_suspect for f in self.failures),
            "failing_schemas": len({f.id for f in self.failures}),
            "failures_by_keyword": dict(Counter(f.keyword if f.keyword != "format"
                                                else f"format:{f.format}"
                                                for f in self.failures)),
            "failures_by_draft": dict(Counter(f.draft for f in self.failures)),
            "dead_ends": len(self.dead_ends),
            "mask_accept_mismatches": len(self.mask_accept_mismatches),
            "engine_failures": len(self.engine_failures),
            "engine_failed_schemas": len({e["id"] for e in self.engine_failures}),
            "validator_errors": len(self.validator_errors),
            "duplicate_keys": len(self.duplicate_keys),
            "duplicate_keys_invalid_first_wins": sum(bool(d["first_wins_error"])
                                                     for d in self.duplicate_keys),
            "formats_unchecked": dict(self.formats_unchecked),
        }

    def to_dict(self) -> dict[str, Any]:
        """Everything, JSON-ready."""
        out = asdict(self)
        out["formats_unchecked"] = dict(self.formats_unchecked)
        return out


@dataclass
class Walk:
    """One walk: its token ids (the stop token left out), whether it ended by the stop token,
    and a problem that ended it early (``"dead_end"``, ``"mismatch:<token>"``,
    ``"engine_failed:<error>"``) if any."""

    ids: list[int]
    finished: bool
    problem: str = ""


# -- the walker ------------------------------------------------------------------------------
class MaskWalker:
    """Random walks through one engine's masks; one runtime, reused for every schema.

    ``timeout_s`` limits each compile (a worker process is killed past it; ``None`` compiles
    in this process, without a limit); ``max_steps`` caps a walk's tokens.
    """

    def __init__(self, info: TokenizerInfo, engine: str, *, timeout_s: float | None = 10.0,
                 max_steps: int = 400, soft_steps: int = 48) -> None:
        if max_steps < 1 or soft_steps < 1:
            raise ValueError(f"max_steps and soft_steps must be >= 1, got {max_steps}, "
                             f"{soft_steps}")
        self.info = info
        self.engine = engine
        self.max_steps = max_steps
        self.soft_steps = soft_steps
        # No engine upgrade: each walk of an `auto` spec on the engine auto chose (an
        # upgraded spec gets the xgrammar engine's grammar, which its own walks cover).
        self.rt = GrammarRuntime(info, engine, compile_timeout_s=timeout_s, fill_threads=1,
                                 failure_ttl_s=0, engine_upgrade=False)
        self.stops = info.stop_token_ids
        self.token_bytes = _token_bytes(info)
        self.classes = _class_words(self.token_bytes, info.bitmask_words, self.stops)
        self.stop_words = _words_of(list(self.stops), info.bitmask_words)
        self._bm = self.rt.allocate_bitmask(1)

    def close(self) -> None:
        """Close the runtime (its compile worker)."""
        self.rt.close()

    def __enter__(self) -> MaskWalker:  # noqa: PYI034 - final class in practice
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def text(self, ids: Sequence[int]) -> bytes:
        """The bytes the tokens ``ids`` write (the engines' own token bytes)."""
        return b"".join(self.token_bytes[t] for t in ids)

    def walk(self, spec: GrammarSpec, rng: np.random.Generator,
             pick: Callable[[np.ndarray, int, np.random.Generator], int] | None = None) -> Walk:
        """One walk through ``spec``'s masks (compiled already: the request is ready at
        once). ``pick(row, step, rng)`` replaces the biased choice (tests plant a pick that
        ignores the mask, to show that the harness fails then)."""
        req = self.rt.new_request(spec, on_error="reject")
        req.wait()
        bm = self._bm
        row = bm[0]
        ids: list[int] = []
        choose = pick or self._pick
        for step in range(self.max_steps):
            req.fill(bm, 0)
            if not row.any():
                return Walk(ids, False, "dead_end")
            if req.failed:
                # The engine failed mid-walk (llguidance's lexer limits): the row now allows
                # only the stop token, so the text would end cut off, and the request says
                # so. Not a text the mask vouches for: reported apart, never validated.
                return Walk(ids, False, f"engine_failed:{req.error}")
            token = choose(row, step, rng)
            if not req.accept(token):
                return Walk(ids, False, f"mismatch:{token}")
            if token in self.stops:
                if req.failed:
                    return Walk(ids, False, f"engine_failed:{req.error}")
                return Walk(ids, True)
            ids.append(token)
        return Walk(ids, False)

    def _pick(self, row: np.ndarray, step: int, rng: np.random.Generator) -> int:
        """A random allowed token; the stop token and closing tokens grow likelier as the
        walk grows (``soft_steps``), whitespace and openers less likely, so walks end."""
        r = min(1.0, step / self.soft_steps)
        stop = row & self.stop_words
        if stop.any() and rng.random() < 0.25 + 0.75 * r:
            return _random_bit(stop, rng)
        weights = {"close": 1.0 + 8.0 * r, "short": 1.5, "other": 1.5 * (1 - r) + 0.1,
                   "open": 0.6 * (1 - r) + 0.02, "space": 0.1 * (1 - r) + 0.005}
        cands = []
        for name in _CLASSES:
            c = row & self.classes[name]
            if c.any():
                cands.append((weights[name], c))
        if not cands:  # only the stop token is allowed
            return _random_bit(row, rng)
        w = np.array([c[0] for c in cands])
        chosen = cands[int(rng.choice(len(cands), p=w / w.sum()))][1]
        return _random_bit(chosen, rng)


def _token_bytes(info: TokenizerInfo) -> list[bytes]:
    """Each id's bytes as the grammar engines read them (xgrammar's decoded vocabulary, so a
    text is exactly what the mask checked, with no detokenizer clean-up), padded ids empty."""
    from ..runtime.engines import xgrammar as xgr_engine

    vocab = [bytes(b) for b in xgr_engine.tokenizer(info).decoded_vocab]
    return vocab + [b""] * (info.vocab_size - len(vocab))


def _words_of(ids: Sequence[int], words: int) -> np.ndarray:
    bits = np.zeros(words * 32, dtype=np.uint8)
    bits[list(ids)] = 1
    return np.packbits(bits, bitorder="little").view(np.int32).copy()


def _class_words(vocab: Sequence[bytes], words: int, stops: Sequence[int]) -> dict[str,
                                                                                  np.ndarray]:
    """Packed bit rows of the token classes (stop tokens in none)."""
    members: dict[str, list[int]] = {name: [] for name in _CLASSES}
    stop_set = set(stops)
    for i, b in enumerate(vocab):
        if i in stop_set or not b:
            continue
        s = b.strip()
        if not s:
            members["space"].append(i)
        elif set(s) <= set(b'"}],:') and set(s) & set(b'"}]'):
            members["close"].append(i)
        elif b"{" in b or b"[" in b:
            members["open"].append(i)
        elif len(b) <= 2:
            members["short"].append(i)
        else:
            members["other"].append(i)
    return {name: _words_of(ids, words) for name, ids in members.items()}


def _random_bit(words: np.ndarray, rng: np.random.Generator) -> int:
    """A uniformly chosen set bit of the packed row ``words``."""
    nz = np.flatnonzero(words)
    bits = np.unpackbits(words[nz].view(np.uint8), bitorder="little")
    pos = np.flatnonzero(bits)
    p = int(pos[rng.integers(len(pos))])
    return int(nz[p >> 5]) * 32 + (p & 31)


# -- validation ------------------------------------------------------------------------------
def draft_of(schema: Any) -> str:
    """The suite folder name of the draft ``schema`` declares (``draft2020-12`` when none or
    an unknown one)."""
    uri = schema.get("$schema") if isinstance(schema, dict) else None
    if isinstance(uri, str):
        bare = uri.rstrip("#")
        for name, known in DRAFTS.items():
            if known.rstrip("#") == bare:
                return name
        return f"unknown:{uri}"
    return "draft2020-12"


def with_draft(schema: Any, draft: str) -> Any:
    """``schema`` declaring ``draft`` (a suite folder name) unless it declares one already;
    boolean schemas are returned as they are (they mean the same in every draft)."""
    if not isinstance(schema, dict) or "$schema" in schema:
        return schema
    return {"$schema": DRAFTS[draft], **schema}


def validator_for(schema: Any) -> Any:
    """The ``jsonschema`` validator of ``schema``'s declared draft (2020-12 by default) with
    its formats asserted: the user's own validator."""
    import jsonschema

    with warnings.catch_warnings():
        # An unknown $schema falls back to 2020-12 with a DeprecationWarning.
        warnings.simplefilter("ignore", DeprecationWarning)
        cls = jsonschema.validators.validator_for(schema,
                                                  default=jsonschema.Draft202012Validator)
    checking = _PATTERN_CLASSES.get(cls)
    if checking is None:
        checking = _PATTERN_CLASSES[cls] = jsonschema.validators.extend(
            cls, {"pattern": _pattern, "patternProperties": _pattern_properties,
                  "additionalProperties": _additional_properties})
    return checking(schema, format_checker=cls.FORMAT_CHECKER)


# Each draft's validator class with the pattern keywords below (\p{...} read by `regex`).
_PATTERN_CLASSES: dict[Any, Any] = {}


def _search(pattern: str, text: str) -> bool:
    """``re.search``, or the ``regex`` module's where ``re`` cannot read the pattern
    (``\\p{Letter}``: ECMA-262 Unicode property escapes), so such texts are checked too
    instead of ending as validator errors."""
    try:
        return re.search(pattern, text) is not None
    except re.error:
        import regex  # (a dependency of transformers, so of every lane with a tokenizer)

        return regex.search(pattern, text) is not None


def _pattern(validator: Any, pattern: str, instance: Any, schema: Any) -> Iterator[Any]:
    import jsonschema

    if validator.is_type(instance, "string") and not _search(pattern, instance):
        yield jsonschema.ValidationError(f"{instance!r} does not match {pattern!r}")


def _additional_properties(validator: Any, extra: Any, instance: Any,
                           schema: Any) -> Iterator[Any]:
    import jsonschema

    if not validator.is_type(instance, "object"):
        return
    named, patterns = schema.get("properties", {}), schema.get("patternProperties", {})
    extras = [k for k in instance
              if k not in named and not any(_search(p, k) for p in patterns)]
    if validator.is_type(extra, "object"):
        for name in extras:
            yield from validator.descend(instance[name], extra, path=name)
    elif extra is False and extras:
        yield jsonschema.ValidationError(
            f"Additional properties are not allowed ({', '.join(map(repr, extras))} "
            "unexpected)")


def _pattern_properties(validator: Any, patterns: dict[str, Any], instance: Any,
                        schema: Any) -> Iterator[Any]:
    if not validator.is_type(instance, "object"):
        return
    for pattern, subschema in patterns.items():
        for name, value in instance.items():
            if _search(pattern, name):
                yield from validator.descend(value, subschema, path=name,
                                             schema_path=pattern)


def unchecked_formats(schema: Any, validator: Any) -> set[str]:
    """The ``format`` values in ``schema`` that ``validator``'s format checker does not
    assert (their packages are not installed, or the format is unknown)."""
    checker = validator.format_checker
    known = set(checker.checkers) if checker is not None else set()
    found: set[str] = set()

    def visit(node: Any) -> None:
        if isinstance(node, dict):
            fmt = node.get("format")
            if isinstance(fmt, str) and fmt not in known:
                found.add(fmt)
            for v in node.values():
                visit(v)
        elif isinstance(node, list):
            for v in node:
                visit(v)

    visit(schema)
    return found


def check_text(raw: bytes, validator: Any) -> tuple[str, str, str] | None:
    """``None`` if ``raw`` is UTF-8 JSON the validator accepts, else ``(keyword, error,
    format)``. Raises what the validator raises when it cannot decide."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        return "utf-8", str(exc), ""
    try:
        value = json.loads(text)
    except (json.JSONDecodeError, RecursionError) as exc:
        return "json", str(exc), ""
    import jsonschema

    error = jsonschema.exceptions.best_match(validator.iter_errors(value))
    if error is None:
        return None
    return _described(error)


def _best_error(validator: Any, value: Any) -> str:
    """The validator's best error on ``value`` as in :func:`check_text`, or ""."""
    import jsonschema

    error = jsonschema.exceptions.best_match(validator.iter_errors(value))
    return "" if error is None else _described(error)[1]


def _described(error: Any) -> tuple[str, str, str]:
    """(keyword, message with the instance path, format) of a ``ValidationError``."""
    fmt = error.schema.get("format", "") if isinstance(error.schema, dict) else ""
    where = "/".join(str(p) for p in error.absolute_path)
    return str(error.validator), f"at /{where}: {error.message}"[:500], str(fmt)


def _first_wins(text: str) -> tuple[bool, Any]:
    """(whether an object of ``text`` repeats a name, the value read keeping each name's
    first occurrence): Python, like most parsers, keeps the last, so a validator never sees
    the first; a reader that keeps the first sees this value."""
    seen = False

    def hook(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        nonlocal seen
        out: dict[str, Any] = {}
        for k, v in pairs:
            if k in out:
                seen = True
            else:
                out[k] = v
        return out

    value = json.loads(text, object_pairs_hook=hook)  # (before reading `seen`)
    return seen, value


# -- running ---------------------------------------------------------------------------------
def _rng(seed: int, item_id: str, walk: int) -> np.random.Generator:
    """Per (seed, schema, walk): a run is deterministic, and one schema's walks do not
    depend on which schemas came before it."""
    return np.random.default_rng([seed, zlib.crc32(item_id.encode()), walk])


def run_generation(items: Iterable[dict[str, Any]], walker: MaskWalker, *, walks: int = 4,
                   seed: int = 0, tries: int = 3,
                   pick: Callable[[np.ndarray, int, np.random.Generator], int] | None = None,
                   progress: Callable[[dict[str, Any]], None] | None = None
                   ) -> GenerationResult:
    """Walk each item's schema until ``walks`` walks finished (at most ``walks * tries``
    walks) and validate every finished text.

    An item is ``{"id", "schema"}``, optionally ``"validate"`` (check the texts against this
    schema instead: tests plant an unsound pairing this way), ``"remote"`` (it names the
    suite's remote server: refusing it is counted apart) and ``"tests"`` (the suite's
    labelled instances: a validator that decides one against its label marks the item's
    failures with a ``note``)."""
    result = GenerationResult(engine=walker.engine)
    for item in items:
        item_id = str(item["id"])
        row: dict[str, Any] = {"id": item_id, "status": "ok", "finished": 0, "unfinished": 0,
                               "failures": 0}
        result.schemas += 1
        result.per_schema.append(row)
        status = _compile(walker, item)
        row["status"] = status[0]
        if status[0] != "ok":
            row["error"] = status[1][:300]
            _count_refusal(result, item, status[0])
            if progress is not None:
                progress(row)
            continue
        spec = status[2]
        if spec is None:  # unreachable: "ok" comes with its spec
            raise RuntimeError(f"no spec for the compiled item {item_id}")
        result.compiled += 1
        if item.get("remote"):
            # Compiled although it names the suite's remote server: its references must
            # resolve in the document ($id), so it is walked (the validator says otherwise).
            result.remote_compiled.append(item_id)
        target = item.get("validate", item["schema"])
        try:
            validator = validator_for(target)
        except Exception as exc:  # noqa: BLE001 - a schema the validator cannot read
            result.validator_errors.append({"id": item_id, "text": "", "error": repr(exc)[:300]})
            continue
        note = "" if "validate" in item else _suite_disagreement(validator, item.get("tests"))
        result.formats_unchecked.update(unchecked_formats(target, validator))
        draft = draft_of(target)
        for i in range(walks * tries):
            if row["finished"] >= walks:
                break
            w = walker.walk(spec, _rng(seed, item_id, i), pick)
            result.tokens += len(w.ids) + w.finished
            raw = walker.text(w.ids)
            if w.problem:
                text = raw.decode("utf-8", "replace")
                if w.problem == "dead_end":
                    result.dead_ends.append({"id": item_id, "text": text})
                elif w.problem.startswith("engine_failed:"):
                    result.engine_failures.append(
                        {"id": item_id, "text": text,
                         "error": w.problem.split(":", 1)[1][:300]})
                else:
                    result.mask_accept_mismatches.append(
                        {"id": item_id, "text": text, "token": w.problem.split(":")[1]})
                continue
            if not w.finished:  # (the step cap)
                row["unfinished"] += 1
                result.walks_unfinished += 1
                continue
            row["finished"] += 1
            result.walks_finished += 1
            try:
                bad = check_text(raw, validator)
            except Exception as exc:  # noqa: BLE001 - the validator cannot decide
                result.validator_errors.append({"id": item_id, "text": raw.decode("utf-8",
                                                "replace"), "error": repr(exc)[:300]})
                continue
            if bad is None:
                text = raw.decode("utf-8")
                repeated, first = _first_wins(text)
                if repeated:
                    # Valid as parsed (last name wins); is it valid for a first-wins reader?
                    try:
                        err = _best_error(validator, first)
                    except Exception as exc:  # noqa: BLE001 - the validator cannot decide
                        err = repr(exc)
                    result.duplicate_keys.append({"id": item_id, "text": text,
                                                  "first_wins_error": err[:300]})
                continue
            keyword, error, fmt = bad
            why, suspect = note, bool(note)
            if keyword in _NUMERIC and _decimal_valid(target, raw):
                why = why or ("valid when numbers are read exactly (decimal), as the "
                              "engines read them: the validator's binary floats decide it")
                suspect = True
            if keyword not in ("json", "utf-8") and _first_wins(raw.decode("utf-8"))[0]:
                # (minProperties met only by counting a repeated name twice, say)
                why = why or "the text repeats a property name (a parser keeps one)"
            row["failures"] += 1
            result.failures.append(Failure(item_id, walker.engine, raw.decode("utf-8",
                                           "replace"), error, keyword, draft, fmt, why,
                                           suspect))
        if progress is not None:
            progress(row)
    return result


_NUMERIC = frozenset({"multipleOf", "enum", "const", "minimum", "maximum", "exclusiveMinimum",
                      "exclusiveMaximum"})


def _decimal_valid(schema: Any, raw: bytes) -> bool:
    """Whether ``raw`` is valid when the schema's and the text's numbers are read exactly
    (fractions and exponents as ``Decimal``, so ``multipleOf`` divides exactly and 10**308
    written out equals ``1e+308``), as the engines read them."""
    from decimal import MAX_EMAX, MIN_EMIN, Context, Decimal, localcontext

    try:
        exact = json.loads(json.dumps(schema), parse_float=Decimal)
        # Enough digits for any JSON number's quotient (1e308 / 3 has 308).
        with localcontext(Context(prec=1000, Emax=MAX_EMAX, Emin=MIN_EMIN)):
            return bool(validator_for(exact).is_valid(json.loads(raw, parse_float=Decimal)))
    except Exception:  # noqa: BLE001 - undecidable: not shown valid
        return False


def _suite_disagreement(validator: Any, tests: Sequence[dict[str, Any]] | None) -> str:
    """A note when ``validator`` decides one of the suite's ``tests`` against its label
    (then a failure may be the validator's bug, not the mask's), else ""."""
    wrong = []
    for i, test in enumerate(tests or ()):
        try:
            if bool(validator.is_valid(test["data"])) != bool(test["valid"]):
                wrong.append(i)
        except Exception:  # noqa: BLE001 - the validator cannot decide: also suspect
            wrong.append(i)
    if not wrong:
        return ""
    return f"jsonschema decides the suite's own tests {wrong} of this group against their label"


def _compile(walker: MaskWalker, item: dict[str, Any]
             ) -> tuple[str, str, GrammarSpec | None]:
    """("ok", "", spec), or (status, error, None) with status refused/empty/timeout."""
    try:
        spec = GrammarSpec.json_schema(item["schema"])
        walker.rt.compile(spec)
    except GrammarTimeout as exc:
        return "timeout", str(exc), None
    except GrammarEmptyLanguage as exc:
        return "empty", str(exc), None
    except (GrammarCompileError, GrammarSpecError, GrammarError, TypeError) as exc:
        return "refused", str(exc), None
    return "ok", "", spec


def _count_refusal(result: GenerationResult, item: dict[str, Any], status: str) -> None:
    if item.get("remote"):
        result.remote_refused += 1
    elif status == "timeout":
        result.timeouts += 1
    elif status == "empty":
        result.empty += 1
    else:
        result.refused += 1


# -- the metamorphic check -------------------------------------------------------------------
# Keywords whose meaning is the same in drafts 6, 7, 2019-09 and 2020-12, given the
# conditions same_reading checks (items as one schema, $ref beside containers only).
_SCHEMA_MAPS = ("properties", "patternProperties", "$defs", "definitions")
_SCHEMA_ONE = ("items", "contains", "additionalProperties", "propertyNames", "not", "if",
               "then", "else")
_SCHEMA_LIST = ("anyOf", "oneOf", "allOf")
_PLAIN = frozenset({
    "type", "enum", "const", "required", "minProperties", "maxProperties", "minItems",
    "maxItems", "uniqueItems", "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum",
    "multipleOf", "minLength", "maxLength", "pattern", "format", "$ref", "$schema", "title",
    "description", "default", "examples", "$comment",
})
_ANNOTATIONS = frozenset({"title", "description", "default", "examples", "$comment",
                          "$schema", *_SCHEMA_MAPS[2:]})


def same_reading(schema: Any) -> bool:
    """True if drafts 7 and 2020-12 read ``schema`` the same way: every keyword is one whose
    meaning they share, ``items`` is a single schema, a ``$ref`` has no sibling that a draft
    7 validator would ignore, and no ``$id``/anchor changes where a reference points."""
    if isinstance(schema, bool):
        return True
    if not isinstance(schema, dict):
        return False
    for key, value in schema.items():
        if key in _SCHEMA_MAPS:
            if not isinstance(value, dict) or not all(same_reading(v) for v in value.values()):
                return False
        elif key in _SCHEMA_ONE:
            if not same_reading(value):
                return False
        elif key in _SCHEMA_LIST:
            if not isinstance(value, list) or not all(same_reading(v) for v in value):
                return False
        elif key not in _PLAIN or (key in ("exclusiveMinimum", "exclusiveMaximum")
                                   and isinstance(value, bool)):
            return False
    return "$ref" not in schema or set(schema) - {"$ref"} <= _ANNOTATIONS


def cross_accept(items: Iterable[dict[str, Any]], walker: MaskWalker, drafts: tuple[str, str]
                 = ("draft7", "draft2020-12"), *, walks: int = 4, seed: int = 0
                 ) -> list[dict[str, Any]]:
    """The metamorphic check: for each item whose schema both ``drafts`` read the same way
    (:func:`same_reading`), the finished walks under one ``$schema`` must be accepted (the
    same token ids, then the stop token) by a request under the other, and vice versa.

    Returns the disagreements ``{"id", "written_under", "rejected_under", "text"}``; for an
    item only one draft compiles, ``{"id", "compiled_under", "refused_under", "error"}``; for
    a request the engine failed on, ``{"id", "written_under", "engine_failed_under", ...}``.
    The schema's own ``$schema`` is replaced."""
    out: list[dict[str, Any]] = []
    stop = walker.stops[0]
    for item in items:
        base = item["schema"]
        if not isinstance(base, dict) or not same_reading(base):
            continue
        bare = {k: v for k, v in base.items() if k != "$schema"}
        specs: dict[str, GrammarSpec] = {}
        errors: dict[str, str] = {}
        for d in drafts:
            status, error, spec = _compile(walker, {"schema": with_draft(bare, d)})
            if spec is not None:
                specs[d] = spec
            else:
                errors[d] = f"{status}: {error[:200]}"
        if len(specs) == 1:
            (ok,) = specs
            out.append({"id": item["id"], "compiled_under": ok,
                        "refused_under": next(iter(errors)), "error": next(iter(errors.values()))})
        if len(specs) != 2:
            continue
        for a, b in (drafts, drafts[::-1]):
            for i in range(walks):
                w = walker.walk(specs[a], _rng(seed, f"{item['id']}|{a}", i))
                if not w.finished:
                    continue
                req = walker.rt.new_request(specs[b], on_error="reject")
                req.wait()
                accepted = req.accept_tokens(w.ids) == len(w.ids) and req.accept(stop)
                text = walker.text(w.ids).decode("utf-8", "replace")
                if req.failed:  # (a failed request accepts the stop token: not a verdict)
                    out.append({"id": item["id"], "written_under": a, "engine_failed_under": b,
                                "text": text, "error": str(req.error)[:300]})
                elif not accepted:
                    out.append({"id": item["id"], "written_under": a, "rejected_under": b,
                                "text": text})
    return out


# -- sources ---------------------------------------------------------------------------------
def suite_folders(draft: str) -> list[str]:
    """The folders holding ``draft``'s suite files: the committed copy under
    ``tests/data/json-schema-test-suite`` and, for 2020-12's required tests, the shared data
    (beside the checkout, ``/work/shared``, or ``$PORTABLE_GUIDED_JSON_SUITE``)."""
    if draft not in DRAFTS:
        raise ValueError(f"unknown draft {draft!r}; known: {sorted(DRAFTS)}")
    repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    tail = os.path.join("data", "json-schema-test-suite", draft)
    candidates = [os.path.join(repo, "tests", tail)]
    if draft == "draft2020-12":
        env = os.environ.get("PORTABLE_GUIDED_JSON_SUITE")
        candidates += [env] if env else []
        candidates += [os.path.join(os.path.dirname(repo), "shared", tail),
                       os.path.join("/work/shared", tail)]
    seen: list[str] = []
    for c in candidates:
        if c and os.path.isdir(c) and os.path.realpath(c) not in map(os.path.realpath, seen):
            seen.append(c)
    return seen


def suite_items(draft: str, folders: Sequence[str] | None = None) -> list[dict[str, Any]]:
    """Every group of ``draft``'s suite (required and optional files) as items
    ``{"id": "draft7/optional/format/date.json#0", "schema", "remote", "tests"}``, each given
    the draft's ``$schema`` unless it declares one (a group's draft is its folder's)."""
    items: dict[str, dict[str, Any]] = {}
    for folder in folders if folders is not None else suite_folders(draft):
        for path in sorted(_json_files(folder)):
            rel = os.path.relpath(path, folder).replace(os.sep, "/")
            with open(path, encoding="utf-8") as fh:
                groups = json.load(fh)
            for i, group in enumerate(groups):
                item_id = f"{draft}/{rel}#{i}"
                items.setdefault(item_id, {
                    "id": item_id, "schema": with_draft(group["schema"], draft),
                    "remote": _REMOTE in json.dumps(group["schema"]),
                    "tests": group["tests"]})
    return list(items.values())


def _json_files(folder: str) -> Iterator[str]:
    for root, _, files in os.walk(folder):
        for name in files:
            if name.endswith(".json"):
                yield os.path.join(root, name)


def maskbench_items(paths: Sequence[str], limit: int | None = None) -> list[dict[str, Any]]:
    """MaskBench records (``{"id", "schema"}``) of the JSONL files ``paths``, the first
    ``limit`` of each."""
    from .maskbench import load_records

    return [{"id": rec["id"], "schema": rec["schema"]} for rec in load_records(paths, limit)]


_NAMES = ("a", "b", "id", "name", "x y")
_PATTERNS = ("^[a-z]+$", "^[0-9]{2,4}$", "^a", "b$", "^(ab|cd)*$", "[A-Z]")
_FORMATS = ("date", "date-time", "time", "email", "ipv4", "ipv6", "uuid", "hostname", "uri")


def schema_strategy() -> Any:
    """A ``hypothesis`` strategy of small schemas: types, properties/required/
    additionalProperties, enum/const, bounded numbers, strings with length, pattern or
    format, arrays with items/minItems/maxItems/contains, anyOf/oneOf/allOf/not, and
    ``$ref`` to ``$defs`` (no ``$schema``: 2020-12; see :func:`same_reading` for draft 7)."""
    from hypothesis import strategies as st

    small = st.integers(-50, 50)
    scalars = st.one_of(st.none(), st.booleans(), small, st.sampled_from(["", "a", "xy"]))

    def numbers(kind: str) -> Any:
        return st.fixed_dictionaries({"type": st.just(kind)}, optional={
            "minimum": small, "maximum": small, "exclusiveMaximum": small,
            "multipleOf": st.sampled_from([1, 2, 5] if kind == "integer" else [0.5, 0.25, 3]),
        })

    strings = st.fixed_dictionaries({"type": st.just("string")}, optional={
        "minLength": st.integers(0, 4), "maxLength": st.integers(0, 8),
        "pattern": st.sampled_from(_PATTERNS), "format": st.sampled_from(_FORMATS)})
    leaves = st.one_of(
        numbers("integer"), numbers("number"), strings,
        st.sampled_from([{"type": "boolean"}, {"type": "null"}, {}, True,
                         {"$ref": "#/$defs/d"}]),
        st.lists(scalars, min_size=1, max_size=4, unique_by=json.dumps).map(
            lambda v: {"enum": v}),
        scalars.map(lambda v: {"const": v}),
    )

    def nested(child: Any) -> Any:
        objects = st.fixed_dictionaries({
            "type": st.just("object"),
            "properties": st.dictionaries(st.sampled_from(_NAMES), child, max_size=3),
        }, optional={"required": st.lists(st.sampled_from(_NAMES), max_size=2, unique=True),
                     "additionalProperties": st.one_of(st.booleans(), child)})
        arrays = st.fixed_dictionaries({"type": st.just("array")}, optional={
            "items": child, "minItems": st.integers(0, 2), "maxItems": st.integers(0, 4),
            "contains": child})
        combos = st.one_of(
            st.builds(lambda k, v: {k: v}, st.sampled_from(["anyOf", "oneOf", "allOf"]),
                      st.lists(child, min_size=1, max_size=3)),
            child.map(lambda v: {"not": v}))
        return st.one_of(objects, arrays, combos)

    body = st.recursive(leaves, nested, max_leaves=6)
    defs = st.one_of(numbers("integer"), strings, st.just({"type": "boolean"}))

    def rooted(pair: tuple[Any, Any]) -> Any:
        schema, target = pair
        if "#/$defs/d" not in json.dumps(schema):
            return schema
        if not isinstance(schema, dict):
            return {"$defs": {"d": target}, "allOf": [schema]}
        return {**schema, "$defs": {"d": target}}

    return st.tuples(body, defs).map(rooted)


def hypothesis_items(n: int, seed: int = 0) -> list[dict[str, Any]]:
    """``n`` schemas drawn from :func:`schema_strategy`, the same for the same ``seed``, as
    items ``{"id": "hypothesis/<seed>/<i>", "schema"}``."""
    from hypothesis import HealthCheck, Phase, given, settings
    from hypothesis import seed as hseed

    drawn: list[Any] = []

    @hseed(seed)
    @settings(max_examples=n, phases=[Phase.generate], database=None, deadline=None,
              suppress_health_check=list(HealthCheck))
    @given(schema_strategy())
    def collect(schema: Any) -> None:
        drawn.append(schema)

    collect()
    return [{"id": f"hypothesis/{seed}/{i}", "schema": s} for i, s in enumerate(drawn[:n])]
