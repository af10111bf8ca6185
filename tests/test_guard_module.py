"""The shared engine guard (``integrations/_guard.py``) without any engine installed.

The fingerprints are pinned to literal values: the tables of every verified build and the
hash of fixed sources must never change, or a plugin silently stops recognising a build (or
recognises the wrong one). The tests under tests/vllm_plugin and tests/sglang_plugin check
the same tables against the installed engines.
"""

from __future__ import annotations

import functools
import logging

import pytest

from portable_guided.integrations import _guard
from portable_guided.integrations.sglang import guard as sglang_guard
from portable_guided.integrations.vllm import guard as vllm_guard

# --- fixed inputs (their source is hashed: do not edit these functions) -----------------


def plain(a, b):
    return a + b


def _deco(f):
    @functools.wraps(f)
    def inner(*args, **kwargs):
        return f(*args, **kwargs)
    return inner


@_deco
@functools.cache
def decorated(x: int) -> int:
    """Two decorators: dropped before hashing."""
    return x * 2


class Holder:
    def method(self, logits, vocab_mask=None):
        # indented: dedented before hashing
        if vocab_mask is None:
            return logits
        return logits.masked_fill_(vocab_mask, float("-inf"))

    @staticmethod
    def static(logits):
        return logits


def _kernel_body(x_ptr, n):
    return x_ptr + n


class _FakeJIT:
    """Like Triton's ``JITFunction``: the Python function under ``fn``."""

    def __init__(self, fn):
        self.fn = fn


# Recorded with the guards as they were before the shared module (the same functions in a
# module of their own): the hashing must not change.
FIXED = {
    "plain": (plain, "21595384131ecf8c"),
    "decorated": (decorated, "6c82138d97ee6da9"),
    "method": (Holder.method, "20e06ca3ac874eb6"),
    "static": (Holder.__dict__["static"].__func__, "079523751b6d614a"),
    "kernel": (_FakeJIT(_kernel_body), "5b0f39b5ed8974ee"),
}

SOURCES = {
    "def f():\n    return 1\n": "8795b1c438f59538",
    "    @triton.jit\n    def f():\n        return 1\n": "8795b1c438f59538",
    "@a\n@b(1)\ndef g(x, y=2):\n    '''doc'''\n    return x * y": "cef12bceec7c79da",
    "": "e3b0c44298fc1c14",
}

VLLM_KNOWN = {
    "0.32.0": {
        "v1_apply": "ff0fc3bed0bec3cc",
        "manager_bitmask": "87ebe01804861df5",
        "v2_init": "bb8fc929e5a9f934",
        "v2_apply": "12e8b5af02c8e662",
        "v2_kernel": "ef24e990a2f13653",
        "v2_mapping": "16335157668a7eb7",
    },
    "0.33.0": {
        "v1_apply": "4c06617058dac4e7",
        "manager_bitmask": "eea443380b6e8e38",
        "v2_init": "a1f120685abc76fe",
        "v2_apply": "5b26217798fb01d5",
        "v2_kernel": "ef24e990a2f13653",
        "v2_mapping": None,
    },
}

SGLANG_KNOWN = {
    "0.5.23": {
        "grammar_mask_apply": "d0afead6992fc5b8",
        "xgr_grammar_apply": "ce153090649dac33",
        "xgr_grammar_allocate": "5e424ca29406d062",
        "xgr_backend_apply": "ef1b01c4cfdbc0ee",
        "xgr_backend_allocate": "514104865672d579",
        "xgr_allocate_bitmask": "d2bd4364e0ce8bb5",
        "llg_grammar_apply": "ccc6257afb79ce54",
        "llg_grammar_allocate": "8b21a27f48d1ea85",
        "out_grammar_apply": "74300c44e03e8f35",
        "out_grammar_allocate": "5be191b52583c2e5",
        "out_grammar_fill": "a36af66951b0397d",
        "out_grammar_move": "62b48525be18d3ea",
    },
}


@pytest.mark.parametrize("name", sorted(FIXED))
def test_fingerprint_of_fixed_functions_is_unchanged(name):
    obj, expected = FIXED[name]
    assert _guard.fingerprint(obj) == expected
    # Both plugins use this one function.
    assert vllm_guard.fingerprint is sglang_guard.fingerprint is _guard.fingerprint


@pytest.mark.parametrize("source", sorted(SOURCES))
def test_fingerprint_of_fixed_sources_is_unchanged(source):
    assert _guard.fingerprint_source(source) == SOURCES[source]


def test_recorded_fingerprints_are_unchanged():
    assert vllm_guard.KNOWN == VLLM_KNOWN
    assert vllm_guard.LAYOUTS == {"0.32.0": "compact", "0.33.0": "block"}
    assert sglang_guard.KNOWN == SGLANG_KNOWN
    # Each plugin's guard matches against its own table, by reference (tests change it).
    assert vllm_guard.GUARD.known is vllm_guard.KNOWN
    assert sglang_guard.GUARD.known is sglang_guard.KNOWN


def test_sglang_guard_does_not_import_the_vllm_plugin():
    import ast
    import inspect

    tree = ast.parse(inspect.getsource(sglang_guard))
    modules = [node.module or "" for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)]
    modules += [a.name for node in ast.walk(tree) if isinstance(node, ast.Import)
                for a in node.names]
    assert not [m for m in modules if "vllm" in m], modules


# --- matching ---------------------------------------------------------------------------


def test_match_known_builds_by_version_and_fingerprints():
    found = _guard.Fingerprints("0.33.0", dict(VLLM_KNOWN["0.33.0"]))
    assert vllm_guard.match(found, "v1") == ("0.33.0", "block")
    # 0.33 has no ``_build_grammar_mapping``: absent there and here is a match.
    assert vllm_guard.match(found, "v2") == ("0.33.0", "block")
    found.values["v2_mapping"] = "16335157668a7eb7"
    assert vllm_guard.match(found, "v2") is None
    assert "_build_grammar_mapping differs from the verified 0.33.0 (v2_mapping)" in (
        vllm_guard.mismatches(found, "v2"))
    # A local version label is the same version; another version is not.
    local = _guard.Fingerprints("0.5.23+cpu", dict(SGLANG_KNOWN["0.5.23"]))
    assert all(sglang_guard.match(local, hook) for hook in sglang_guard.HOOK_FUNCTIONS)
    other = _guard.Fingerprints("0.5.24", dict(SGLANG_KNOWN["0.5.23"]))
    assert not sglang_guard.match(other, "xgrammar")
    assert sglang_guard.mismatches(other, "xgrammar") == "SGLang 0.5.24 is not a verified build"


def test_a_function_the_engine_lacks_never_matches_a_recorded_one():
    values = dict(SGLANG_KNOWN["0.5.23"], llg_grammar_apply=None)
    found = _guard.Fingerprints("0.5.23", values)
    assert not sglang_guard.match(found, "llguidance")
    assert sglang_guard.match(found, "xgrammar")
    assert "GuidanceGrammar.apply_vocab_mask differs" in sglang_guard.mismatches(
        found, "llguidance")
    no_source = dict(SGLANG_KNOWN["0.5.23"], xgr_grammar_apply=_guard.NO_SOURCE)
    assert not sglang_guard.match(_guard.Fingerprints("0.5.23", no_source), "xgrammar")


def test_a_fingerprint_missing_from_the_table_never_matches():
    guard = _guard.EngineGuard("E", logging.getLogger("t"), {"f": ("m", "f"), "g": ("m", "g")},
                               {"both": ("f", "g")}, {"1.0": {"f": "x"}}, "apply")
    found = _guard.Fingerprints("1.0", {"f": "x", "g": None})
    assert guard.match(found, "both") is None
    assert "m.g differs" in guard.mismatches(found, "both")
    with pytest.raises(KeyError, match="no takeover 'other'; known: both"):
        guard.match(found, "other")


def test_current_reads_functions_through_the_class_dict(monkeypatch):
    import types

    module = types.ModuleType("guard_fixture")
    module.Holder = Holder
    module.kernel = _FakeJIT(_kernel_body)
    monkeypatch.setitem(__import__("sys").modules, "guard_fixture", module)
    guard = _guard.EngineGuard(
        "E", logging.getLogger("t"),
        {"method": ("guard_fixture", "Holder.method"), "static": ("guard_fixture", "Holder.static"),
         "kernel": ("guard_fixture", "kernel"), "gone": ("guard_fixture", "Holder.gone"),
         "no_module": ("guard_fixture_missing", "f")},
        {}, {}, "apply")
    values = guard.current("1.0", {"method": decorated}).values
    assert values == {"method": FIXED["decorated"][1], "static": FIXED["static"][1],
                      "kernel": FIXED["kernel"][1], "gone": None, "no_module": None}
    module.kernel = len  # a builtin has no source
    assert guard.current("1.0").values["kernel"] == _guard.NO_SOURCE


# --- the canary -------------------------------------------------------------------------


class _Log(logging.Handler):
    def __init__(self):
        super().__init__(logging.DEBUG)
        self.errors: list[str] = []

    def emit(self, record):
        if record.levelno >= logging.ERROR:
            self.errors.append(record.getMessage())


@pytest.fixture
def engine():
    logger = logging.getLogger("tests.guard_module")
    handler = _Log()
    logger.addHandler(handler)
    guard = _guard.EngineGuard("Engine", logger, {}, {}, {}, "apply_mask",
                               lambda kinds: ", ".join(sorted(map(str, kinds))))
    try:
        yield guard, handler
    finally:
        logger.removeHandler(handler)


def _fill(value):
    def run(out):
        out.fill_(value)
    return run


def test_canary_passes_same_results_and_checks_each_kind_once(engine):
    torch = pytest.importorskip("torch")
    guard, log = engine
    restored = []
    canary = _guard.Canary(guard, "hook", lambda: restored.append(1))
    logits = torch.zeros(2, 4)
    assert canary.due({"first"})
    assert canary.check(logits, {"first"}, _fill(1.0), _fill(1.0))
    assert torch.equal(logits, torch.ones(2, 4))
    assert not canary.due({"first"}) and canary.due({"first", "speculative"})
    # NaN equals NaN.
    assert canary.check(logits, {"first", "speculative"}, _fill(float("nan")),
                        _fill(float("nan")))
    assert canary.seen == {"first", "speculative"} and canary.checks == 2
    assert not restored and not log.errors and not canary.tripped


def test_canary_keeps_the_engines_logits_and_restores_on_a_difference(engine):
    torch = pytest.importorskip("torch")
    guard, log = engine
    restored = []
    canary = _guard.Canary(guard, "V1", lambda: restored.append(1))

    def wrong(out):
        out.fill_(1.0)
        out[1, 2] = float("-inf")

    logits = torch.zeros(2, 4)
    assert not canary.check(logits, {"first"}, wrong, _fill(1.0))
    assert torch.equal(logits, torch.ones(2, 4))  # the engine's result for this batch
    assert restored == [1] and canary.tripped and not canary.due({"other"})
    (error,) = log.errors
    assert error.startswith("portable_guided's V1 apply_mask differs from Engine's on 1 logits "
                            "(rows [1]) (first): Engine's result is used for this batch")


def test_canary_ours_raising_is_a_difference(engine):
    torch = pytest.importorskip("torch")
    guard, log = engine
    restored = []
    canary = _guard.Canary(guard, "hook", lambda: restored.append(1))

    def broken(out):
        out.fill_(7.0)  # wrote before failing: the engine's result still wins
        raise ValueError("duplicate rows")

    logits = torch.zeros(3)
    assert not canary.check(logits, ("first",), broken, _fill(2.0))
    assert torch.equal(logits, torch.full((3,), 2.0)) and restored == [1]
    assert "raised ValueError: duplicate rows" in log.errors[0]


def test_canary_survives_the_engines_own_function_raising(engine):
    """The engine's error is the engine's behaviour: it propagates, the engine's function is
    back, the logits are not touched by ours, and the kind is not checked again."""
    torch = pytest.importorskip("torch")
    guard, log = engine
    restored = []
    canary = _guard.Canary(guard, "hook", lambda: restored.append(1))
    ran_ours = []

    def theirs(out):
        raise RuntimeError("Unsupported device: cpu")

    logits = torch.zeros(2, 3)
    with pytest.raises(RuntimeError, match="Unsupported device"):
        canary.check(logits, ("first",), ran_ours.append, theirs)
    assert not ran_ours and torch.equal(logits, torch.zeros(2, 3))
    assert restored == [1] and canary.tripped and canary.seen == {"first"}
    (error,) = log.errors
    assert "Engine's own function raised on this input" in error


def test_plugin_canaries_speak_for_their_engine():
    torch = pytest.importorskip("torch")
    assert vllm_guard.kinds(True, False) == frozenset({"first", "speculative"})
    assert vllm_guard.kinds(False, False) is vllm_guard.kinds(False, False)
    v1 = vllm_guard.canary("v1", lambda: None)
    assert v1.name == "V1" and v1.guard is vllm_guard.GUARD
    assert vllm_guard.GUARD.describe(vllm_guard.kinds(True, True)) == (
        "speculative=True, unconstrained=True")
    logits = torch.zeros(2, 64)
    kind = sglang_guard.kind_of(logits, torch.zeros(2, 1, dtype=torch.int32))
    assert kind == ("cpu", torch.float32, 2, True)
    assert sglang_guard.GUARD.describe(frozenset({kind})) == (
        "device cpu, torch.float32, 2-D, logits wider than mask: True")


def test_takeover_records_build_and_forced():
    takeover = vllm_guard.Takeover(name="v1", original=plain, build="0.32.0", layout="compact")
    assert not takeover.forced and takeover.canary is None
    forced = sglang_guard.Takeover(name="xgrammar", original=plain, build=_guard.FORCED,
                                   target="m.C.f", static=False)
    assert forced.forced and isinstance(forced, _guard.Takeover)


def test_lmdeploy_guard_is_data_on_the_shared_guard():
    """lmdeploy's guard imports without lmdeploy and matches against its own table; every
    function a takeover relies on has a verified fingerprint."""
    from portable_guided.integrations.lmdeploy import guard as lmdeploy_guard

    assert lmdeploy_guard.GUARD.known is lmdeploy_guard.KNOWN
    assert set(lmdeploy_guard.KNOWN) == {"0.18.0"}
    for names in lmdeploy_guard.TAKEOVER_FUNCTIONS.values():
        assert set(names) <= set(lmdeploy_guard.KNOWN["0.18.0"]) == set(lmdeploy_guard.FUNCTIONS)
    found = _guard.Fingerprints("0.18.0", dict(lmdeploy_guard.KNOWN["0.18.0"],
                                               fused_call="0" * 16))
    assert lmdeploy_guard.GUARD.match(found, "apply") is None
    assert "FusedLogitsProcessor.__call__ differs" in lmdeploy_guard.GUARD.mismatches(
        found, "apply")
