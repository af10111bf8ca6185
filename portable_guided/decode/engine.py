"""Batched guided generation over any :class:`~portable_guided.decode.device.Runner`.

:class:`Generator` is a small continuous-batching engine written against the runner protocol
and the grammar runtime, with no framework code of its own:

* **Pipelined step** (no speculation). Step N's forward is launched on the device tokens sampled
  at step N-1, before the host has seen them. Meanwhile a CPU worker
  (:class:`~portable_guided.decode.overlap.OverlappedStep`) waits for those tokens' copy event,
  has the runtime accept them and fills step N's bitmask. Then the bitmask is uploaded
  (non-blocking), applied with ``apply_token_mask``, and step N's tokens are sampled and their
  host copy started. A request that finishes at N-1 wastes one row of step N; nothing waits
  for the device as a whole.
* **Speculative step** (``num_draft > 0``). Draft tokens come from :class:`NgramDraft` as a
  chain, or with ``draft_branches > 1`` as a tree merging several earlier continuations. One
  forward scores the last token plus every draft (tree attention: each draft sees only its
  ancestors), while the worker fills one mask row per draft node
  (``Request.fill_draft_tree``: the state after the path to that node). From the root, the
  draft equal to the (masked) sample is followed as long as there is one; the tokens on that
  path plus one bonus token are accepted and the KV cache keeps just that path. Because each
  accepted token was masked and sampled exactly as without speculation, greedy output is
  identical.

Requests join when a slot is free and their grammar has compiled (a slow compile never blocks
the batch), finish on EOS, grammar termination or ``max_tokens``, and fail alone when their
grammar fails to compile or rejects a token.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from portable_guided.decode.device import Pending, Runner, SamplingParams
from portable_guided.decode.draft import DraftTree, NgramDraft
from portable_guided.decode.overlap import OverlappedStep
from portable_guided.runtime.errors import GrammarError

__all__ = ["GenerationOutput", "GenerationRequest", "GenerationStats", "Generator"]

_FILL_ALL = np.int32(-1)


@dataclass
class GenerationRequest:
    """One prompt to complete.

    ``grammar`` is a runtime request (``GrammarRuntime.new_request(spec)``) or ``None`` for free
    text. ``request_id`` defaults to the position in the list given to
    :meth:`Generator.generate`.
    """

    prompt_ids: Sequence[int]
    max_tokens: int = 64
    grammar: Any = None
    request_id: Any = None

    def __post_init__(self) -> None:
        if len(self.prompt_ids) == 0:
            raise ValueError("prompt_ids is empty")
        if self.max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {self.max_tokens}")


@dataclass
class GenerationOutput:
    """The result of one request.

    ``finish_reason``: ``"stop"`` (EOS or the grammar completed), ``"length"`` (``max_tokens``)
    or ``"error"`` (grammar compile failure or timeout, rejected token; see ``error``).
    ``token_ids`` exclude the stop token.
    """

    request_id: Any
    token_ids: list[int]
    finish_reason: str
    error: BaseException | None = None
    first_token_s: float | None = None


@dataclass
class GenerationStats:
    """Timing of one :meth:`Generator.generate` call.

    ``grammar_s`` is CPU time in the runtime (accepting tokens, filling bitmasks);
    ``visible_grammar_s`` the part of it the step had to wait for (all of it without overlap).
    """

    wall_s: float = 0.0
    steps: int = 0
    output_tokens: int = 0
    grammar_s: float = 0.0
    visible_grammar_s: float = 0.0
    forward_rows: int = 0
    draft_tokens: int = 0
    accepted_draft_tokens: int = 0

    @property
    def tokens_per_s(self) -> float:
        """Output tokens per second of wall time."""
        return self.output_tokens / self.wall_s if self.wall_s else 0.0

    @property
    def grammar_share(self) -> float:
        """Visible grammar time as a share of wall time."""
        return self.visible_grammar_s / self.wall_s if self.wall_s else 0.0


@dataclass
class _Seq:
    req: GenerationRequest
    index: int
    slot: int = -1
    generated: list[int] = field(default_factory=list)
    out: GenerationOutput | None = None
    last: int = -1  # speculative mode: the accepted token not yet in the KV cache
    first_token_s: float | None = None
    draft_index: Any = None  # NgramIndex over prompt + generated, when the draft has one

    @property
    def grammar(self) -> Any:
        return self.req.grammar

    @property
    def history(self) -> list[int]:
        return [*self.req.prompt_ids, *self.generated]


@dataclass
class _InFlight:
    """Tokens sampled on the device for ``seqs`` whose host copy is ``host``."""

    seqs: list[_Seq]
    tokens: Any
    host: Pending


class Generator:
    """Continuous-batching guided generation on a runner.

    ``runtime`` is the :class:`portable_guided.runtime.GrammarRuntime` whose requests appear in
    :attr:`GenerationRequest.grammar` (needed only for guided requests). ``overlap`` runs grammar
    work during the forward; ``None`` (default) asks the runner (``runner.prefers_overlap``:
    True on accelerators, False when the forward itself runs on the host CPU, where the two
    would compete for the same cores); ``num_draft`` > 0 turns on speculative decoding with
    up to that many draft tokens per request and step from ``draft``, in a tree of up to
    ``draft_branches`` branches (1: a chain).

    Example::

        gen = Generator(runner, runtime=rt)
        req = GenerationRequest(prompt_ids, 128, rt.new_request(GrammarSpec.json_schema(s)))
        (out,) = gen.generate([req])
    """

    def __init__(
        self,
        runner: Runner,
        *,
        runtime: Any = None,
        overlap: bool | None = None,
        max_batch: int = 32,
        num_draft: int = 0,
        draft_branches: int = 1,
        draft: NgramDraft | None = None,
        sampling: SamplingParams | None = None,
        on_step: Callable[[int], None] | None = None,
    ) -> None:
        if max_batch < 1:
            raise ValueError(f"max_batch must be >= 1, got {max_batch}")
        if num_draft < 0:
            raise ValueError(f"num_draft must be >= 0, got {num_draft}")
        if draft_branches < 1:
            raise ValueError(f"draft_branches must be >= 1, got {draft_branches}")
        self.runner = runner
        self.runtime = runtime
        self.overlap = (
            bool(getattr(runner, "prefers_overlap", True)) if overlap is None else overlap
        )
        self.max_batch = max_batch
        self.num_draft = num_draft
        self.draft_branches = draft_branches
        self.draft = draft or NgramDraft()
        self.sampling = sampling or SamplingParams()
        self.on_step = on_step
        self.stats = GenerationStats()

    # -- public ---------------------------------------------------------------------------
    def generate(self, requests: Sequence[GenerationRequest]) -> list[GenerationOutput]:
        """Run every request to completion; outputs in request order. Resets :attr:`stats`
        (the new run's statistics, live while it runs)."""
        if any(r.grammar is not None for r in requests) and self.runtime is None:
            raise ValueError("guided requests need Generator(runtime=...)")
        run = _Run(self, requests)
        self.stats = run.stats
        return run.execute()


class _Run:
    """The state of one :meth:`Generator.generate` call: slots, waiting requests, the two
    host bitmask buffers and the statistics. Local to the call, so the Generator keeps only
    its configuration."""

    def __init__(self, gen: Generator, requests: Sequence[GenerationRequest]) -> None:
        self.runner = gen.runner
        self.runtime = gen.runtime
        self.overlap = gen.overlap
        self.num_draft = gen.num_draft
        self.draft_branches = gen.draft_branches
        self.draft = gen.draft
        self.sampling = gen.sampling
        self.on_step = gen.on_step
        self.stats = GenerationStats()
        self.seqs = [_Seq(r, i) for i, r in enumerate(requests)]
        self._ring: list[np.ndarray] = []
        self._ring_next = 0
        self._free: list[int] = []
        self._waiting: deque[_Seq] = deque(self.seqs)
        self._t0 = time.perf_counter()
        self._max_batch = gen.max_batch

    def execute(self) -> list[GenerationOutput]:
        """Run every sequence to completion; outputs in request order."""
        seqs = self.seqs
        if not seqs:
            return []
        max_len = max(len(s.req.prompt_ids) + s.req.max_tokens for s in seqs) + self.num_draft + 2
        slots = min(self._max_batch, len(seqs))
        self.runner.reset(slots, max_len)
        rows = slots * (self.num_draft + 1)
        words = self.runtime.bitmask_words if self.runtime is not None else 1
        self._ring = [self.runner.host_buffer((rows, words)) for _ in range(2)]
        for buf in self._ring:
            buf.fill(_FILL_ALL)
        self._free = list(range(slots - 1, -1, -1))
        self._t0 = time.perf_counter()
        step = OverlappedStep(overlap=self.overlap)
        try:
            if self.num_draft:
                self._run_speculative(step)
            else:
                self._run_pipelined(step)
        finally:
            step.close()
        self.stats.wall_s = time.perf_counter() - self._t0
        return [_finished(s) for s in seqs]

    # -- the two loops --------------------------------------------------------------------
    def _run_pipelined(self, step: OverlappedStep) -> None:
        inflight: _InFlight | None = None
        while True:
            new = self._admit(block=inflight is None)
            if inflight is None and not new:
                return
            parts: list[tuple[list[_Seq], Any]] = []
            if inflight is not None:
                part = self._decode_step(step, inflight)
                if part is not None:
                    parts.append(part)
            if new:
                parts.append((new, self._prefill(step, new)))
            self._end_step()
            if not parts:
                inflight = None
                continue
            seqs = [s for p, _ in parts for s in p]
            tokens = self.runner.concat([t for _, t in parts])
            inflight = _InFlight(seqs, tokens, self.runner.to_host(tokens))

    def _decode_step(self, step: OverlappedStep, inflight: _InFlight) -> tuple[list[_Seq], Any] | None:
        """Forward ``inflight``'s tokens while the worker accepts them and fills the masks;
        returns the surviving sequences and their next (device) tokens."""
        seqs, tokens = inflight.seqs, inflight.tokens
        slots = [s.slot for s in seqs]  # read before the worker frees finished ones

        def grammar(host: np.ndarray) -> tuple[list[int], np.ndarray | None]:
            alive = [i for i, s in enumerate(seqs) if not self._accept(s, int(host[i]))]
            return alive, self._fill(seqs, alive)

        (alive, buf), logits = self._overlapped(
            step, grammar, lambda: self.runner.forward(slots, tokens), inflight.host.wait
        )
        self.stats.forward_rows += len(seqs)
        if not alive:
            return None
        sampled = self._mask_and_sample(logits, buf)
        return [seqs[i] for i in alive], self.runner.select(sampled, alive)

    def _run_speculative(self, step: OverlappedStep) -> None:
        running: list[_Seq] = []
        while True:
            new = self._admit(block=not running)
            if not running and not new:
                return
            if new:
                first = self.runner.to_host(self._prefill(step, new)).wait()
                t = time.perf_counter()
                for s, tok in zip(new, first):
                    if not self._accept(s, int(tok)):
                        s.last = int(tok)
                        running.append(s)
                self._visible(time.perf_counter() - t)
            if running:
                running = self._verify_step(step, running)
                self._end_step()

    def _verify_step(self, step: OverlappedStep, seqs: list[_Seq]) -> list[_Seq]:
        """Score each sequence's last token plus its draft tree in one forward (masks filled
        meanwhile), keep the path of drafts that match the samples plus one token, roll back
        the rest."""
        trees = [self._propose(s) for s in seqs]
        counts = [1 + len(t) for t in trees]
        ids = np.zeros((len(seqs), max(counts)), dtype=np.int64)
        for i, (s, t) in enumerate(zip(seqs, trees)):
            ids[i, : counts[i]] = [s.last, *t.tokens]
        parents = [[-1, *(p + 1 for p in t.parents)] for t in trees]
        slots = [s.slot for s in seqs]
        starts = [self.runner.length(slot) for slot in slots]
        buf, logits = self._overlapped(
            step,
            lambda _: self._fill_trees(seqs, trees, counts),
            lambda: self.runner.forward(slots, ids, counts, parents=parents),
        )
        self.stats.forward_rows += sum(counts)
        host = self.runner.to_host(self._mask_and_sample(logits, buf)).wait()
        t0 = time.perf_counter()
        running, offset = [], 0
        for s, tree, c, start in zip(seqs, trees, counts, starts):
            targets = [int(x) for x in host[offset : offset + c]]
            offset += c
            child = {  # (node, token) -> the child of node carrying token; root = node 0
                (p + 1, tok): i + 1 for i, (p, tok) in enumerate(zip(tree.parents, tree.tokens))
            }
            path = [0]
            while (nxt := child.get((path[-1], targets[path[-1]]))) is not None:
                path.append(nxt)
            self.stats.draft_tokens += len(tree)
            self.stats.accepted_draft_tokens += len(path) - 1
            # The cache keeps the last token and the matched drafts; the bonus token is next.
            self.runner.retain(s.slot, start, path)
            accepted = [targets[node] for node in path]
            if not any(self._accept(s, tok) for tok in accepted):
                s.last = accepted[-1]
                running.append(s)
        self._visible(time.perf_counter() - t0)
        return running

    def _propose(self, s: _Seq) -> DraftTree:
        k = min(self.num_draft, s.req.max_tokens - len(s.generated))
        make_index = getattr(self.draft, "index", None)
        if make_index is not None:  # incremental: cost independent of the history's length
            if s.draft_index is None:
                s.draft_index = make_index(s.req.prompt_ids)
            index = s.draft_index
            index.extend(s.generated[len(index) - len(s.req.prompt_ids):])
            if self.draft_branches == 1:
                return DraftTree.chain(index.propose(k))
            return index.propose_tree(k, self.draft_branches)
        if self.draft_branches == 1:
            return DraftTree.chain(self.draft.propose(s.history, k))
        return self.draft.propose_tree(s.history, k, self.draft_branches)

    def _end_step(self) -> None:
        self.stats.steps += 1
        if self.on_step is not None:
            self.on_step(self.stats.output_tokens)

    # -- pieces ---------------------------------------------------------------------------
    def _overlapped(
        self,
        step: OverlappedStep,
        grammar: Callable[[Any], Any],
        device: Callable[[], Any],
        wait: Callable[[], Any] | None = None,
    ) -> tuple[Any, Any]:
        """Run ``grammar(wait())`` on the worker while ``device()`` runs; returns both results.

        Grammar time counts as visible only where it outlasts both the device part's call and
        the wait (for the previous tokens' copy), i.e. where the caller sat idle because of it.
        On asynchronous devices the device part returns at once, so this is an upper bound;
        the benchmark measures the real cost as a difference of step times.
        """
        marks: dict[str, float] = {}

        def cpu() -> Any:
            waited = wait() if wait is not None else None
            marks["start"] = time.perf_counter()
            try:
                return grammar(waited)
            finally:
                marks["end"] = time.perf_counter()

        def dev() -> Any:
            try:
                return device()
            finally:
                marks["device"] = time.perf_counter()

        result, out = step.run(cpu, dev)
        spent = marks["end"] - marks["start"]
        self.stats.grammar_s += spent
        if self.overlap:
            self.stats.visible_grammar_s += max(
                0.0, marks["end"] - max(marks["device"], marks["start"])
            )
        else:
            self.stats.visible_grammar_s += spent
        return result, out

    def _visible(self, seconds: float) -> None:
        """Grammar work done on the caller's thread between steps (never hidden)."""
        self.stats.grammar_s += seconds
        self.stats.visible_grammar_s += seconds

    def _admit(self, *, block: bool) -> list[_Seq]:
        """Move waiting requests whose grammar is ready into free slots.

        Requests whose grammar failed finish with an error here. With ``block`` (nothing is
        running) waits briefly for a compile instead of spinning.
        """
        admitted: list[_Seq] = []
        while True:
            still: deque[_Seq] = deque()
            while self._waiting:
                s = self._waiting.popleft()
                g = s.grammar
                if g is not None and g.failed:
                    self._finish(s, "error", g.error)
                elif (g is None or g.ready) and self._free:
                    s.slot = self._free.pop()
                    self.runner.truncate(s.slot, 0)  # a reused slot starts empty
                    admitted.append(s)
                else:
                    still.append(s)
            self._waiting = still
            if admitted or not block or not self._waiting:
                return admitted
            time.sleep(0.002)

    def _prefill(self, step: OverlappedStep, seqs: list[_Seq]) -> Any:
        """Run the prompts of ``seqs`` and sample their first tokens (device tokens)."""
        counts = [len(s.req.prompt_ids) for s in seqs]
        ids = np.zeros((len(seqs), max(counts)), dtype=np.int64)
        for i, s in enumerate(seqs):
            ids[i, : counts[i]] = s.req.prompt_ids

        slots = [s.slot for s in seqs]
        buf, logits = self._overlapped(
            step, lambda _: self._fill(seqs, range(len(seqs))),
            lambda: self.runner.forward(slots, ids, counts),
        )
        self.stats.forward_rows += len(seqs)
        return self._mask_and_sample(logits, buf)

    def _next_buffer(self, rows: int) -> np.ndarray:
        buf = self._ring[self._ring_next]
        self._ring_next ^= 1
        self.runner.host_bitmask_ready(buf)  # the upload two steps ago no longer reads it
        return buf[:rows]

    def _fill(self, seqs: Sequence[_Seq], rows: Sequence[int]) -> np.ndarray | None:
        """Bitmask for ``seqs``: the grammar's rows for ``rows``, all-allowed elsewhere.

        Returns ``None`` when no row is constrained (the step then skips masking), so the
        decision to mask and the buffer's contents always agree.
        """
        live = set(rows)
        grammars = [s.grammar if i in live else None for i, s in enumerate(seqs)]
        if all(g is None for g in grammars):
            return None
        buf = self._next_buffer(len(seqs))
        self.runtime.fill_bitmask(grammars, buf)  # writes every row; None: all allowed
        return buf

    def _fill_trees(
        self, seqs: Sequence[_Seq], trees: Sequence[DraftTree], counts: Sequence[int]
    ) -> np.ndarray | None:
        """One bitmask row per scored node: the state after the path to it (``None`` when no
        sequence is constrained). Nodes the grammar rejects get all-allowed rows: they
        can never be on the accepted path, and masking them fully would leave nothing to
        sample."""
        if all(s.grammar is None for s in seqs):
            return None
        buf = self._next_buffer(sum(counts))
        offset = 0
        for s, tree, c in zip(seqs, trees, counts):
            if s.grammar is not None:
                first_child, next_sibling = tree.links()
                valid = s.grammar.fill_draft_tree(
                    first_child, next_sibling, [s.last, *tree.tokens], buf, offset
                )
                buf[offset + np.flatnonzero(~valid)] = _FILL_ALL
            else:
                buf[offset : offset + c] = _FILL_ALL
            offset += c
        return buf

    def _mask_and_sample(self, logits: Any, buf: np.ndarray | None) -> Any:
        if buf is not None:
            logits = self.runner.apply_mask(logits, self.runner.upload_bitmask(buf))
        return self.runner.sample(logits, self.sampling)

    def _accept(self, s: _Seq, token: int) -> bool:
        """Record ``token`` for ``s``; returns True when ``s`` finished (and frees its slot)."""
        if s.out is not None:
            return True
        if s.first_token_s is None:
            s.first_token_s = time.perf_counter() - self._t0
        g = s.grammar
        if g is not None:
            try:
                ok = g.accept(token)
            except GrammarError as exc:  # on_error="raise": this request fails, the rest go on
                self._finish(s, "error", exc)
                return True
            if not ok:
                self._finish(s, "error", g.error or ValueError(f"grammar rejected token {token}"))
                return True
            stop = g.is_terminated
        else:
            stop = token == self.runner.eos_token_id
        if stop:
            self._finish(s, "stop")
            return True
        s.generated.append(token)
        self.stats.output_tokens += 1
        if len(s.generated) >= s.req.max_tokens:
            self._finish(s, "length")
            return True
        return False

    def _finish(self, s: _Seq, reason: str, error: BaseException | None = None) -> None:
        s.out = GenerationOutput(
            request_id=s.req.request_id if s.req.request_id is not None else s.index,
            token_ids=list(s.generated),
            finish_reason=reason,
            error=error,
            first_token_s=s.first_token_s,
        )
        if s.slot >= 0:
            self._free.append(s.slot)
            s.slot = -1


def _finished(s: _Seq) -> GenerationOutput:
    if s.out is None:  # every loop exits only when no sequence is waiting or running
        raise RuntimeError(f"request {s.index} did not finish")
    return s.out
