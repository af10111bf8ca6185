"""A decode-loop trace on XLA: after precompiling the buckets, nothing compiles, the logits never
leave the device, and exactly one bitmask upload happens per step.

The simulated engine does what vLLM's TPU runner does: its logits buffer has a bucket's rows
(the live batch padded up), its bitmask buffer has ``MAX_BATCH`` rows filled on the CPU for the
constrained requests only, and it calls ``apply_token_mask(logits, bitmask, indices=...)``.
Counts come from ``torch_xla.debug.metrics`` (see ``xla_support.py``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pytest

torch = pytest.importorskip("torch")
torch_xla = pytest.importorskip("torch_xla")

import portable_guided as pg
from portable_guided.precompile import precompile
from portable_guided.reference import reference_apply_token_mask
from tests.xla.xla_support import (
    XlaCounts,
    expected_mask,
    graph_hash,
    random_bitmask,
    xla_counts,
)

pytestmark = pytest.mark.xla

MAX_BATCH = 64
VOCAB = 2000  # logits width; 63 words, the last one partly past the vocabulary
WORDS = -(-VOCAB // 32)
STEPS = 200
BUCKETS = pg.bucket_sizes(MAX_BATCH)  # (8, 16, 32, 64)


@dataclass
class Trace:
    """What a trace observed, step by step."""

    steps: int = 0
    compiles: int = 0
    violations: list[str] = field(default_factory=list)
    graphs: dict[int, set[bytes]] = field(default_factory=dict)  # logits rows -> graph hashes
    rows_seen: set[int] = field(default_factory=set)


def run_trace(steps: int, dtype: str, *, pad: bool, seed: int) -> Trace:
    """Run ``steps`` decode steps with random live batches, constrained subsets, bitmasks and
    ``vocab_size``.

    ``pad=True`` pads the logits to the bucket of the live batch (what engines must do);
    ``pad=False`` gives the logits exactly the live batch's rows (what breaks static shapes).
    """
    rng = np.random.default_rng(seed)
    device = torch_xla.device()
    bitmask = np.full((MAX_BATCH, WORDS), -1, dtype=np.int32)  # the engine's reusable buffer
    bitmask_view = torch.from_numpy(bitmask)  # zero-copy: refills show through
    trace = Trace()
    for step in range(steps):
        live = int(rng.integers(1, MAX_BATCH + 1))
        rows = pg.bucket_for(live, MAX_BATCH) if pad else live
        # Mostly some constrained rows; now and then none or all of them.
        count = int(rng.choice([0, live, *rng.integers(1, live + 1, size=8)]))
        constrained = np.sort(rng.choice(live, size=count, replace=False)).tolist()
        bitmask[constrained] = random_bitmask(rng, count, WORDS)
        # The tokenizer's vocabulary may be narrower than the logits: that must not change the graph.
        vocab_size = [None, VOCAB, VOCAB - 37][int(rng.integers(3))]
        host = torch.from_numpy(rng.standard_normal((rows, VOCAB), dtype=np.float32))
        host = host.to(getattr(torch, dtype))
        logits = host.to(device)
        torch_xla.sync()  # the logits are device data, as a model step leaves them

        before = xla_counts()
        pg.apply_token_mask(logits, bitmask_view, indices=constrained, vocab_size=vocab_size)
        if constrained:
            trace.graphs.setdefault(rows, set()).add(graph_hash(logits))
        torch_xla.sync()
        window = xla_counts() - before

        trace.steps += 1
        trace.rows_seen.add(rows)
        trace.compiles += window.compiles
        _check_window(trace, step, live, rows, constrained, window)
        got = logits.cpu().float().numpy()  # outside the window: the test's own read-back
        want = expected_mask(host.float().numpy(), bitmask, constrained, vocab_size)
        if not np.array_equal(got, want):
            trace.violations.append(f"step {step}: values differ from the expected mask")
    return trace


def _check_window(trace: Trace, step: int, live: int, rows: int, constrained: list[int],
                  window: XlaCounts) -> None:
    uploads = 1 if constrained else 0
    expected_bytes = rows * WORDS * 4 if constrained else 0
    problems = []
    if window.compiles:
        problems.append(f"{window.compiles} compilation(s)")
    if window.d2h_transfers or window.d2h_bytes:
        problems.append(f"{window.d2h_transfers} device-to-host transfer(s), {window.d2h_bytes} B")
    if window.h2d_transfers != uploads or window.h2d_bytes != expected_bytes:
        problems.append(f"{window.h2d_transfers} host-to-device transfer(s) of {window.h2d_bytes} B"
                        f" (expected {uploads} of {expected_bytes} B: the bitmask)")
    if problems:
        trace.violations.append(f"step {step} (live batch {live}, logits rows {rows}, "
                                f"{len(constrained)} constrained): " + "; ".join(problems))


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_padded_trace_never_recompiles_or_reads_back(dtype: str) -> None:
    report = precompile(max_batch=MAX_BATCH, vocab=VOCAB, dtype=dtype, progress=False)
    assert [b.rows for b in report.buckets] == list(BUCKETS)
    # Exactly one graph per bucket: the apply graph, nothing else (no fill graph for the zeros).
    assert [b.graphs_compiled for b in report.buckets] == [1] * len(BUCKETS)
    cached_graphs = torch_xla._XLAC._xla_get_num_cached_compilation_graph()

    trace = run_trace(STEPS, dtype, pad=True, seed=len(dtype))

    assert not trace.violations, f"{len(trace.violations)} bad steps:\n" + "\n".join(trace.violations[:8])
    assert trace.compiles == 0
    assert trace.steps >= 200
    assert trace.rows_seen == set(BUCKETS), "the trace should visit every bucket"
    assert torch_xla._XLAC._xla_get_num_cached_compilation_graph() == cached_graphs
    # One apply graph per bucket, whatever the live batch, constrained subset or bitmask.
    assert {rows: len(hashes) for rows, hashes in trace.graphs.items()} == {b: 1 for b in BUCKETS}


def test_unpadded_batch_is_caught() -> None:
    """The checks above can fail: logits with the live batch's rows compile a graph per new
    row count, and the trace reports each of those steps."""
    precompile(max_batch=MAX_BATCH, vocab=VOCAB, dtype="bfloat16", progress=False)

    trace = run_trace(40, "bfloat16", pad=False, seed=3)

    assert trace.compiles > 0
    assert any("compilation" in v for v in trace.violations)
    assert len(trace.rows_seen - set(BUCKETS)) > 0
    assert sum(len(h) for h in trace.graphs.values()) > len(BUCKETS)


def test_expected_mask_agrees_with_reference() -> None:
    """The trace's fast vectorized expectation is itself checked against the reference."""
    rng = np.random.default_rng(5)
    logits = rng.standard_normal((8, VOCAB), dtype=np.float32)
    bitmask = random_bitmask(rng, 8, WORDS)
    rows = [0, 1, 4, 7]
    for vocab_size in (None, VOCAB - 37):
        np.testing.assert_array_equal(
            expected_mask(logits, bitmask, rows, vocab_size),
            reference_apply_token_mask(logits, bitmask, indices=rows, vocab_size=vocab_size),
        )
