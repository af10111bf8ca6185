"""The start-up prewarm of xgrammar's shared token masks (engines/xgrammar_prewarm.py).

xgrammar's compiler cache hands a rule's token masks to any later grammar holding the same
rule, so the prewarm helps only if its schemas produce the very rule text that real schemas
produce where the same keywords sit deeper (a property, a nullable type, array items, a
``$ref``, beside annotations): checked here rule by rule against the engine's own text for
those schemas. The runtime runs it in the background at the lowest priority, every schema
compiling, and stops it at ``close``."""

from __future__ import annotations

import os
import re
import sys
import threading
import time

import pytest

from portable_guided.runtime import GrammarRuntime, GrammarSpec, load_tokenizer_info
from portable_guided.runtime import compile_service as service
from portable_guided.runtime.engines import create_engine
from portable_guided.runtime.engines.xgrammar_prewarm import (
    SEED_SCHEMA,
    prewarm,
    prewarm_schemas,
)

pytest.importorskip("xgrammar")
pytest.importorskip("llguidance")



@pytest.fixture(scope="module")
def info():
    return load_tokenizer_info("smollm2")


@pytest.fixture(scope="module")
def engine(info):
    return create_engine("xgrammar", info)


def rule_bodies(engine, schema) -> set[str]:
    """The bodies of the rules the engine compiles for ``schema``, with the names of the
    rules they refer to left out: a rule is named after its place in the schema
    (``root_1``, ``root_prop_0_type_0_characters``, ``defs_d``, ``pg_free_name_3``);
    xgrammar's shared ``basic_*`` rules keep theirs."""
    ebnf = engine.prepared_ebnf(engine.prepare(GrammarSpec.json_schema(schema)))
    rules = [line.partition(" ::= ") for line in ebnf.splitlines() if " ::= " in line]
    named = [re.escape(name) for name, _, _ in rules if not name.startswith("basic_")]
    name = re.compile(r"\b(?:" + "|".join(sorted(named, key=len, reverse=True)) + r")\b")
    return {name.sub("R", body) for _, _, body in rules}


def string_contexts(keywords: dict) -> list[dict]:
    """Schemas holding a string with ``keywords`` where real schemas put one."""
    string = {"type": "string", **keywords}
    return [
        {"type": "object", "properties": {"v": string}, "required": ["v"]},
        {"type": "object", "properties": {"v": {**string, "type": ["string", "null"]}}},
        {"type": "array", "items": string, "maxItems": 3},
        {"type": "object", "properties": {"v": {"$ref": "#/$defs/d"}},
         "$defs": {"d": {**string, "title": "T", "description": "a value"}},
         "additionalProperties": False},
    ]


def name_contexts(char: str) -> list[dict]:
    """Open objects whose declared names leave ``char`` out of a free name, at the top and
    deeper in the name's trie, nested."""
    return [
        {"type": "object", "properties": {char + "x": {"type": "integer"}}},
        {"type": "object", "properties": {"k" + char: {"type": "string"}}, "required": ["k" + char]},
        {"type": "object", "properties": {"o": {"type": "object", "properties": {
            char: {"type": "boolean"}}}}, "additionalProperties": False},
    ]


def piece_contexts(letters: str) -> list[dict]:
    """Open objects whose declared names start with ``letters`` (longer names, other types),
    at the top and nested, and a fork inside a name on the same letters."""
    names = {c + "name_" + c: {"type": "integer"} for c in letters}
    return [
        {"type": "object", "properties": names, "required": [next(iter(names))]},
        {"type": "object", "properties": {"o": {"type": "object", "properties": names}},
         "additionalProperties": False},
        {"type": "object", "properties": {"id" + c: {"type": "string"} for c in letters}},
    ]


def test_each_prewarm_schema_holds_rules_that_real_schemas_hold(engine):
    baseline = {"string": rule_bodies(engine, {"type": "string"}),
                "object": rule_bodies(engine, {"type": "object"})}
    checked = 0
    for schema in list(prewarm_schemas())[1:]:  # (after the seed: below)
        own = rule_bodies(engine, schema) - baseline[schema["type"]]
        assert own, f"{schema} compiles to no rule of its own"
        if schema["type"] == "string":  # (its pattern, or its repeat of characters)
            own = {body for body in own if "Regex(" in body or re.search(r"\{\d+, \d+\}", body)}
            assert len(own) == 1, f"{schema}: {sorted(own)}"
            contexts = string_contexts({k: v for k, v in schema.items() if k != "type"})
        elif len(schema["properties"]) > 1:  # the pieces of a way out of several letters
            letters = "".join(name[0] for name in schema["properties"])
            # (the rest leaves out every block: "...\\nabcdef...")
            own = {body for body in own if body.startswith("(([")
                   and (not body.startswith("(([^") or "nabcdef" in body)}
            assert any(body.startswith("(([^") for body in own), sorted(own)  # the rest
            assert sum(not body.startswith("(([^") for body in own) >= 3, sorted(own)
            contexts = piece_contexts(letters)
        else:  # (what it is for: the free name's way out that leaves the character out)
            (char,) = schema["properties"]
            own = {body for body in own if body.startswith("(([^")}
            assert any(f"{char}] basic_string_sub" in body for body in own), sorted(own)
            contexts = name_contexts(char)
        for context in contexts:
            missing = own - rule_bodies(engine, context)
            assert not missing, f"{schema}'s rules {sorted(missing)} are not in {context}"
            checked += 1
    assert checked >= 4 * 60 + 3 * 60


def test_the_seed_comes_first_a_closed_object_of_the_shared_json_rules(engine):
    # The first grammar holding a shared rule decides how xgrammar keeps its masks: a
    # closed object's way, the most common (engines/xgrammar_prewarm.py, SEED_SCHEMA).
    schemas = list(prewarm_schemas())
    assert schemas[0] is SEED_SCHEMA and SEED_SCHEMA not in schemas[1:]
    ebnf = engine.prepared_ebnf(engine.prepare(GrammarSpec.json_schema(SEED_SCHEMA)))
    assert "pg_free_name" not in ebnf and "addl" not in ebnf, ebnf  # (no open object)
    for rule in ("basic_string_sub", "basic_integer", "basic_number", "basic_boolean"):
        assert re.search(rf"^{rule} ::=", ebnf, re.MULTILINE), f"{rule} not in the seed's grammar"


def test_prewarm_compiles_every_schema_and_stops_when_told(engine):
    stop = threading.Event()
    stop.set()
    assert prewarm(engine, stop) == (0, 0)
    pieces = list(prewarm_schemas())
    # A few of each kind compile (the whole list runs in the runtime test below).
    sample = [pieces[0], pieces[-4], next(p for p in pieces if "format" in p)]
    for schema in sample:
        engine.compile(GrammarSpec.json_schema(schema))


def test_runtime_prewarms_in_the_background_at_the_lowest_priority(info):
    with GrammarRuntime(info, "auto", compile_timeout_s=20) as rt:
        thread = rt._service._prewarm_thread
        assert thread is not None and thread.is_alive()
        if sys.platform.startswith("linux"):
            deadline = time.monotonic() + 5
            while time.monotonic() < deadline:  # (the thread lowers itself as it starts)
                try:
                    nice = os.getpriority(os.PRIO_PROCESS, thread.native_id)
                except OSError:
                    break  # (ended already)
                if nice == service.PREWARM_NICE:
                    break
                time.sleep(0.01)
            assert nice == service.PREWARM_NICE
        # Compiles go on meanwhile: a schema compiled and decided while it runs.
        spec = GrammarSpec.json_schema({"type": "object", "properties": {
            "n": {"type": "string", "maxLength": 8}}, "required": ["n"],
            "additionalProperties": False})
        assert rt.compile_async(spec).result(timeout=20) is not None
        assert rt._service.prewarm_done.wait(120), "the prewarm did not end"
        metrics = rt.metrics()
        assert metrics["prewarm_compiled"] == len(list(prewarm_schemas()))
        assert metrics["prewarm_failed"] == 0


def test_close_stops_the_prewarm(info):
    rt = GrammarRuntime(info, "auto", compile_timeout_s=20)
    assert not rt._service.prewarm_done.is_set()
    rt.close()
    # It ends after the schema it was compiling (the largest bound compiles in seconds).
    assert rt._service.prewarm_done.wait(30)
    rt._service._prewarm_thread.join(5)
    assert not rt._service._prewarm_thread.is_alive()
    assert rt.metrics()["prewarm_compiled"] < len(list(prewarm_schemas()))


@pytest.mark.parametrize("options", [{"engine_prewarm": False}, {"engine_upgrade": False},
                                     {"compile_timeout_s": None}])
def test_no_prewarm_without_the_upgrades_or_when_off(info, options):
    with GrammarRuntime(info, "auto", **{"compile_timeout_s": 20, **options}) as rt:
        assert rt._service.prewarm_done.is_set()
        assert rt._service._prewarm_thread is None


def test_a_process_that_never_closes_its_runtime_exits_cleanly(tmp_path):
    # The prewarm is stopped and waited for at exit: a thread left inside xgrammar's
    # compile while the interpreter finalizes can abort the process.
    import subprocess

    script = tmp_path / "never_closed.py"
    script.write_text(
        "import time\n"
        "from portable_guided.runtime import GrammarRuntime, GrammarSpec\n"
        "rt = GrammarRuntime('smollm2', 'auto', compile_timeout_s=20)\n"
        "rt.compile(GrammarSpec.json_schema({'type': 'string', 'maxLength': 3}))\n"
        "time.sleep(1.0)\n"
        "assert not rt._service.prewarm_done.is_set()\n"
        "print('exiting')\n")
    t0 = time.monotonic()
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, check=False,
                          timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "exiting" in done.stdout
    # Well before the whole prewarm (about 10 s on this vocabulary): stopped, not finished.
    assert time.monotonic() - t0 < 60
