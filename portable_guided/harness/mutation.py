"""Soundness probe: does an engine accept an instance the schema rejects?

The differential (``harness.differential``) compares the engines on MaskBench's own
instances, which are realistic: a keyword an engine ignores goes unseen there whenever no
instance happens to break it (xgrammar ignored a ``type`` beside ``anyOf``, which only a
value of another type shows). This probe takes each valid instance and changes it at every
place it has, one change at a time: a value of each other JSON type, a property added or
removed, an item added or removed, a string or number moved off its value. Each changed
instance is walked through the engine (as JSON text, then the stop token); where the engine
accepts it, the ``jsonschema`` validator (formats asserted, as the engines assert them) must
accept it too. Anything else is an instance the engine would let a model write that the
user's own validator rejects.

Used by ``bench/json_mutation_probe.py`` (a MaskBench sample) and
``tests/harness/test_mutation.py``.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Sequence
from decimal import MAX_EMAX, MIN_EMIN, Context, Decimal, localcontext
from typing import Any

from ..runtime.errors import GrammarCompileError, GrammarSpecError
from ..runtime.runtime import GrammarRuntime
from ..runtime.specs import GrammarSpec
from ..runtime.tokenizer_info import TokenizerInfo

__all__ = ["mutations", "probe_engine", "validator"]

#: A value of each JSON type (a changed value takes each one its place does not hold).
_OTHERS: tuple[Any, ...] = (0, 1.5, "x", True, None, [], {})


def _places(value: Any, path: tuple[Any, ...] = ()) -> Iterator[tuple[tuple[Any, ...], Any]]:
    """Every (path, value) of ``value``, the whole first, parents before children."""
    yield path, value
    if isinstance(value, dict):
        for k, v in value.items():
            yield from _places(v, (*path, k))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield from _places(v, (*path, i))


def _replaced(value: Any, path: tuple[Any, ...], new: Any) -> Any:
    if not path:
        return new
    out = json.loads(json.dumps(value))  # (a copy)
    node = out
    for part in path[:-1]:
        node = node[part]
    node[path[-1]] = new
    return out


def _changes(here: Any) -> Iterator[Any]:
    """The values put in place of ``here``: each other type, then edits of its own kind."""
    for other in _OTHERS:
        if type(other) is not type(here):
            yield other
    if isinstance(here, dict):
        yield {**here, "pg_probe": 1}
        for k in here:
            yield {n: v for n, v in here.items() if n != k}
    elif isinstance(here, list):
        yield [*here, here[-1] if here else 0]
        yield [*here, 0]
        if here:
            yield here[:-1]
    elif isinstance(here, str):
        yield here + "x"
        yield ""
        yield here.upper() if here != here.upper() else here.lower()
    elif isinstance(here, bool):
        yield not here
    elif isinstance(here, (int, float)):
        yield here + 1
        yield -here - 1
        yield here + 0.5
        yield here * 1000 + 7


def mutations(instance: Any, limit: int) -> list[Any]:
    """Up to ``limit`` changed copies of ``instance``, one change each (distinct, none equal
    to ``instance``), spread over its places: each place's changes in turn, round-robin."""
    per_place = [[_replaced(instance, path, new) for new in _changes(here)]
                 for path, here in _places(instance)]
    out: list[Any] = []
    seen = {json.dumps(instance, sort_keys=True)}
    depth = 0
    while len(out) < limit and any(depth < len(c) for c in per_place):
        for changes in per_place:
            if depth < len(changes) and len(out) < limit:
                key = json.dumps(changes[depth], sort_keys=True)
                if key not in seen:
                    seen.add(key)
                    out.append(changes[depth])
        depth += 1
    return out


def _decided_valid(check: Any, instance: Any) -> bool:
    try:
        return bool(check.is_valid(instance))
    except Exception:  # noqa: BLE001 - the validator cannot decide (a $ref cycle)
        return False


def validator(schema: Any) -> Any:
    """The ``jsonschema`` validator of ``schema``'s draft (2020-12 without ``$schema``), with
    formats asserted and ``multipleOf`` decided on the numbers as written (decimal), as the
    engines decide it: the validator's own divides binary floats, so 0.5075 would not be a
    multiple of 0.0001 there."""
    import jsonschema

    cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
    cls = jsonschema.validators.extend(cls, {"multipleOf": _decimal_multiple_of})
    return cls(schema, format_checker=cls.FORMAT_CHECKER)


def _decimal_multiple_of(validator: Any, divisor: Any, instance: Any,
                         schema: Any) -> Iterator[Any]:
    from jsonschema.exceptions import ValidationError

    if not validator.is_type(instance, "number"):
        return
    try:
        # Exact: enough digits for any JSON number's quotient (1e308 / 3 has 308).
        with localcontext(Context(prec=1000, Emax=MAX_EMAX, Emin=MIN_EMIN)):
            whole = Decimal(repr(instance)) % Decimal(repr(divisor)) == 0
    except (ArithmeticError, ValueError):
        whole = False
    if not whole:
        yield ValidationError(f"{instance!r} is not a multiple of {divisor!r}")


def probe_engine(records: Sequence[dict[str, Any]], info: TokenizerInfo, engine: str, *,
                 per_instance: int = 40, seeds: int = 1, strict: bool = False,
                 timeout_s: float | None = 10.0,
                 progress: Callable[[dict[str, Any]], None] | None = None
                 ) -> list[dict[str, Any]]:
    """One row per schema ``engine`` compiles: ``{"id", "tried", "accepted_invalid":
    [instance JSON text...]}`` (the first ``seeds`` valid instances of each record are
    mutated, ``per_instance`` changes each). ``strict``: the strict variant
    (``strict=True``), checked against the schema as ``strict_schema`` writes it (the seeds
    are the record's valid instances that it accepts)."""
    from ..json_schema.strict import strict_schema

    # (No engine upgrade: every instance of a spec decided by the engine auto chose.)
    rt = GrammarRuntime(info, engine, compile_timeout_s=timeout_s, fill_threads=1,
                        failure_ttl_s=0, engine_upgrade=False)
    stop = info.stop_token_ids[0]
    rows: list[dict[str, Any]] = []
    try:
        for rec in records:
            valid = [t["data"] for t in rec.get("tests", []) if t["valid"]]
            if not valid:
                continue
            try:
                spec = GrammarSpec.json_schema(rec["schema"], strict=strict)
                rt.compile(spec)
                check = validator(strict_schema(rec["schema"]) if strict else rec["schema"])
                if strict:  # (the strict variant rejects some of the valid instances)
                    valid = [v for v in valid if _decided_valid(check, v)]
            except (GrammarCompileError, GrammarSpecError, TypeError):
                continue
            except Exception:  # noqa: BLE001, S112 - a schema the validator cannot read
                continue
            row: dict[str, Any] = {"id": rec.get("id"), "tried": 0, "accepted_invalid": []}
            changes = [m for seed in valid[:seeds] for m in mutations(seed, per_instance)]
            for changed in changes:
                text = json.dumps(changed, ensure_ascii=False)
                ids = info.encode(text)
                req = rt.new_request(spec, on_error="reject")
                row["tried"] += 1
                if req.accept_tokens(ids) == len(ids) and req.accept(stop):
                    try:
                        ok = check.is_valid(changed)
                    except Exception:  # noqa: BLE001 - the validator cannot decide
                        ok = True
                    if not ok:
                        row["accepted_invalid"].append(text)
            rows.append(row)
            if progress is not None:
                progress(row)
    finally:
        rt.close()
    return rows
