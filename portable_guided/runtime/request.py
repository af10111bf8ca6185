"""A request: one sequence's grammar state, its error policy and its reasoning phase."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import operator
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Executor, Future
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from .engines.base import first_line
from .errors import GrammarEngineError, GrammarNotReady, GrammarRejectedToken
from .rows import as_numpy_bitmask

if TYPE_CHECKING:
    from .compile_service import CompiledGrammar
    from .engines.base import Engine, Matcher
    from .metrics import Metrics
    from .rows import SpecialRows

__all__ = ["ON_ERROR_POLICIES", "ReasoningConfig", "Request", "RequestContext"]

log = logging.getLogger(__name__)

#: What a rejected token does. ``raise`` (default, fails closed): the request fails with
#: :class:`GrammarRejectedToken`, its row then allows only stop tokens, the rest of the batch
#: goes on. ``terminate``: ``accept`` returns False and the next mask forces a stop token.
#: ``reject``: ``accept`` returns False and the state is unchanged, so the engine may
#: resample from the same mask; the constraint stays.
ON_ERROR_POLICIES = ("raise", "terminate", "reject")

PENDING, ACTIVE, TERMINATED, FAILED = "pending", "active", "terminated", "failed"

#: A request moves to its spec's upgraded grammar (``CompiledGrammar.upgraded``) only while
#: it has accepted at most this many grammar tokens: the move feeds them all to a new
#: matcher, under the request's lock (xgrammar: about 2 us a token).
HANDOVER_MAX_TOKENS = 256

# Log entry kinds (one per accepted token), so rollback can cross phase boundaries.
_THINK, _GRAMMAR, _STOP = 0, 1, 2


@dataclass(frozen=True)
class ReasoningConfig:
    """A reasoning phase before the constraint starts.

    The constraint applies after the token sequence ``think_end_ids`` (e.g. the ids of
    ``</think>``) has been generated. While thinking, every token except the stop tokens is
    allowed. With ``budget`` set, after ``budget`` thinking tokens the mask forces the rest of
    ``think_end_ids``.
    """

    think_end_ids: tuple[int, ...]
    budget: int | None = None

    def __post_init__(self) -> None:
        if not self.think_end_ids:
            raise ValueError("think_end_ids must not be empty")
        object.__setattr__(self, "think_end_ids", tuple(int(t) for t in self.think_end_ids))
        if self.budget is not None and self.budget < 0:
            raise ValueError(f"budget must be >= 0 or None, got {self.budget}")


@dataclass(frozen=True)
class RequestContext:
    """What a request shares with the other requests of its runtime.

    Attributes:
        rows: the rows no grammar fills (stop tokens only, reasoning phase).
        metrics: where accepted, rejected and failed counts go.
        executor: runs the blocking calls behind the ``async`` methods.
        next_serial: a new number per request; batch fills lock requests in this order.
        discard: called with a compiled grammar an engine failed on mid-request, to drop it
            from the memory cache (state its matchers share may be broken).
    """

    rows: SpecialRows
    metrics: Metrics
    executor: Executor
    next_serial: Callable[[], int]
    discard: Callable[[Any], object] | None = None


class Request:
    """One sequence constrained by a grammar. Create it with ``GrammarRuntime.new_request``.

    All methods are thread-safe and check their arguments before touching any state (a
    token id outside ``[0, vocab_size)``, a bool, a row outside the bitmask: ``TypeError`` or
    ``ValueError`` naming the value, the request unchanged).

    While the grammar compiles (``ready`` is False), tokens passed to :meth:`accept` (e.g.
    produced by a prefill node) are queued and return True; they are checked as soon as the
    grammar is ready. A queued token the grammar rejects fails the request whatever its
    ``on_error`` policy (the sequence already holds the token, so it cannot be resampled):
    ``failed`` becomes True and ``error`` says which token, and the tokens queued after it
    are not consumed. ``fill_bitmask`` leaves the row of a pending request untouched, so
    engines hold such requests back from sampling, as they do with prefill.

    A failed request's row allows only the stop tokens. Accepting a stop token then ends
    it (``accept`` returns True) under the ``terminate`` and ``reject`` policies, so an
    engine that resamples on rejection never loops; ``raise`` re-raises the failure.

    A batch fill (``GrammarRuntime.fill_bitmask``, or an engine's own batching loop) uses
    only the batch contract: :attr:`serial`, :attr:`fill_lock`, :meth:`fill_target`,
    :attr:`engine`, :meth:`check_filled` and :attr:`fill_cost_s`.
    """

    def __init__(
        self,
        future: Future[CompiledGrammar],
        context: RequestContext,
        *,
        on_error: str = "raise",
        reasoning: ReasoningConfig | None = None,
    ) -> None:
        if on_error not in ON_ERROR_POLICIES:
            raise ValueError(f"on_error must be one of {ON_ERROR_POLICIES}, got {on_error!r}")
        if reasoning is not None and not isinstance(reasoning, ReasoningConfig):
            raise TypeError(f"reasoning must be a ReasoningConfig, got {type(reasoning).__name__}")
        self._vocab_size = context.rows.vocab_size
        if reasoning is not None:
            bad = [t for t in reasoning.think_end_ids if not 0 <= t < self._vocab_size]
            if bad:
                raise ValueError(f"think_end_ids {bad[:5]} out of range [0, {self._vocab_size})")
        self._rows = context.rows
        self._live_words = context.rows.live_words
        self._discard = context.discard
        self._compiled: Any = None
        self._metrics = context.metrics
        self._executor = context.executor
        self._lock = threading.Lock()
        # The bitmask :meth:`fill` checked last: (it, rows, shape, a tensor's data pointer
        # or None, a memoryview of its words).
        self._seen_bitmask: tuple[Any, int, Any, int | None, Any] = (None, 0, None, None, None)
        self.on_error = on_error
        self.reasoning = reasoning
        self.stop_token_ids: tuple[int, ...] = context.rows.stop_token_ids
        self._stops = frozenset(self.stop_token_ids)
        #: Set by the engine while the sequence is in (chunked) prefill: its row is skipped.
        self.in_prefill = False
        self._state = PENDING
        self._engine: Engine | None = None
        self._matcher_errors = False  # the engine's matchers can enter an error state
        self._matcher: Matcher | None = None
        self._error: BaseException | None = None
        self._forced_stop = False
        self._queued: list[int] = []
        self._log: list[int] = []  # entry kind per accepted token
        # The grammar's tokens so far, for a hand-over to an upgraded grammar (None: none
        # will be tried).
        self._grammar_ids: list[int] | None = None
        self._grammar_tokens = 0  # accepted by the matcher (0: at the grammar's start)
        self._first_token = -1  # the first of them (CompiledGrammar.second_masks)
        self._thinking = reasoning is not None
        self._think_log: list[int] = []
        self._think_progress = 0
        self.num_rejected = 0
        #: Seconds this request's last batch-filled mask took. The batching loop writes it
        #: and starts each batch with the costliest rows.
        self.fill_cost_s = 0.0
        self._serial = context.next_serial()
        self._ready_event = threading.Event()
        self._callbacks_lock = threading.Lock()
        self._ready_callbacks: list[Callable[[Request], object]] | None = []
        self._future = future
        future.add_done_callback(self._on_compiled)

    # -- state -----------------------------------------------------------------------------
    @property
    def ready(self) -> bool:
        """True once the compile finished (successfully or not)."""
        return self._state != PENDING

    @property
    def failed(self) -> bool:
        """True if the compile failed or a token was rejected under ``on_error="raise"``."""
        return self._state == FAILED

    @property
    def error(self) -> BaseException | None:
        """Why the request failed (or was terminated by the ``terminate`` policy)."""
        return self._error

    @property
    def is_terminated(self) -> bool:
        """True once a stop token was accepted, or a stop is forced (policy ``terminate``)."""
        return self._state == TERMINATED or self._forced_stop

    @property
    def is_thinking(self) -> bool:
        """True while in the reasoning phase (the constraint has not started)."""
        return self._thinking

    @property
    def engine_name(self) -> str | None:
        """The engine of the grammar this request runs on (``None`` while pending or
        failed). It changes once if the spec's engine upgrade lands while the request runs
        (:meth:`hand_over`, :meth:`fill_target`)."""
        return self._engine.name if self._engine is not None else None

    @property
    def num_accepted(self) -> int:
        """Tokens accepted so far (thinking, grammar and stop tokens)."""
        return len(self._log)

    def wait(self, timeout: float | None = None) -> Request:
        """Block until the compile finished; returns ``self`` (errors stay in ``error``).

        Raises ``TimeoutError`` if the compile is still running after ``timeout`` seconds.
        """
        if not self._ready_event.wait(timeout):
            raise TimeoutError(f"grammar still compiling after {timeout} s")
        return self

    def add_ready_callback(self, fn: Callable[[Request], object]) -> None:
        """Call ``fn(self)`` once the compile finished, successfully or not (then
        :attr:`ready` is True and :attr:`failed` tells which): at once in this thread if it
        has, else in the thread that finished it, which ``fn`` must not block for long. An
        exception ``fn`` raises is logged, never raised. Lets an engine wait for many
        compiles without a thread per request (e.g. vLLM's grammar futures)."""
        if not callable(fn):
            raise TypeError(f"fn must be callable, got {type(fn).__name__}")
        with self._callbacks_lock:
            if self._ready_callbacks is not None:
                self._ready_callbacks.append(fn)
                return
        self._run_callback(fn)

    def _run_callback(self, fn: Callable[[Request], object]) -> None:
        try:
            fn(self)
        except Exception:  # a caller's callback must not break the compile thread
            log.exception("ready callback %r of a grammar request failed", fn)

    def _on_compiled(self, fut: Future[CompiledGrammar]) -> None:
        try:
            self._install(fut)
        finally:
            self._ready_event.set()
            with self._callbacks_lock:
                callbacks, self._ready_callbacks = self._ready_callbacks or [], None
            for fn in callbacks:
                self._run_callback(fn)

    def _install(self, fut: Future[CompiledGrammar]) -> None:
        with self._lock:
            exc = fut.exception()
            if exc is not None:
                self._fail(exc)
                return
            compiled = fut.result()
            self._engine = compiled.engine
            self._matcher_errors = compiled.engine.matcher_errors
            self._compiled = compiled
            try:
                self._matcher = compiled.engine.new_matcher(compiled.grammar)
            except Exception as err:  # noqa: BLE001 - an engine bug fails only this request
                self._fail(err)
                return
            self._state = ACTIVE
            self._grammar_ids = []
            if compiled.riders is not None:  # (an upgrade compiles: it moves this request)
                compiled.add_rider(self)
            queued, self._queued = self._queued, []
            for i, token in enumerate(queued):
                if self._try_accept(token):
                    self._metrics.inc("tokens_accepted")
                    continue
                if self._state != FAILED:  # rejected (an engine failure is recorded already)
                    self.num_rejected += 1
                    self._metrics.inc("tokens_rejected")
                    self._fail(GrammarRejectedToken(
                        token, len(self._log),
                        f"accepted while the grammar compiled and rejected once it was ready "
                        f"(the sequence already holds it); {len(queued) - i - 1} later queued "
                        "tokens not consumed"))
                log.info("request failed on a token queued before its grammar was ready: %s",
                         self._error)
                break

    def _active_matcher(self) -> Matcher:
        """The matcher of a compiled request (ACTIVE or TERMINATED)."""
        if self._matcher is None:
            raise RuntimeError(f"request in state {self._state!r} has no matcher")
        return self._matcher

    def _failure(self) -> BaseException:
        """The error a failed request raises again."""
        if self._error is None:
            return RuntimeError("request failed without a recorded error")
        return self._error

    def _fail(self, exc: BaseException) -> None:
        if self._state != FAILED:
            self._state = FAILED
            self._error = exc
            self._metrics.inc("requests_failed")

    def _engine_failed(self, detail: str) -> None:
        """The engine's matcher entered an error state it cannot leave: fail the request and
        drop the grammar from the memory cache (matchers may share the broken state)."""
        self._fail(GrammarEngineError(
            f"the {self.engine_name} engine failed at position {len(self._log)}: "
            f"{first_line(detail)}"))
        self._metrics.inc("engine_errors")
        log.warning("request failed inside the grammar engine: %s", self._error)
        if self._discard is not None and self._compiled is not None:
            self._discard(self._compiled)

    def _token(self, token_id: Any) -> int:
        """``token_id`` as a vocabulary id, or TypeError/ValueError naming it."""
        if isinstance(token_id, (bool, np.bool_)):
            raise TypeError(f"token id must be an int, got a bool ({token_id!r})")
        try:
            token = operator.index(token_id)
        except TypeError:
            raise TypeError(
                f"token id must be an int, got {type(token_id).__name__} ({token_id!r:.40})"
            ) from None
        if not 0 <= token < self._vocab_size:
            raise ValueError(f"token id {token} out of range [0, {self._vocab_size})")
        return token

    # -- accepting -------------------------------------------------------------------------
    def accept(self, token_id: int) -> bool:
        """Accept one sampled token.

        Returns True if accepted. A token the grammar rejects never removes the constraint:
        per ``on_error`` it raises :class:`GrammarRejectedToken` (``raise``), returns False
        and forces a stop (``terminate``) or returns False with the state unchanged
        (``reject``). On a failed request, ``raise`` re-raises the failure.
        """
        token = self._token(token_id)
        with self._lock:
            return self._accept_locked(token)

    def accept_tokens(self, token_ids: Sequence[int]) -> int:
        """Speculative verification: accept the longest valid prefix of ``token_ids`` and
        return its length; the first rejected token and the rest are not consumed (no
        ``on_error`` policy applies: rejecting a draft is normal)."""
        tokens = self._tokens(token_ids, "token_ids")
        with self._lock:
            if self._state == PENDING:
                raise GrammarNotReady("accept_tokens needs a compiled grammar")
            n = 0
            for t in tokens:
                if not self._try_accept(t):
                    break
                n += 1
            self._metrics.inc("tokens_accepted", n)
            return n

    def rollback(self, n: int = 1) -> None:
        """Undo the last ``n`` accepted tokens (across the reasoning boundary too)."""
        if isinstance(n, bool) or not isinstance(n, (int, np.integer)):
            raise TypeError(f"rollback count must be an int, got {type(n).__name__} ({n!r:.40})")
        if n < 0:
            raise ValueError(f"rollback count must be >= 0, got {n}")
        with self._lock:
            self._rollback_locked(n)

    def _accept_locked(self, token: int) -> bool:
        state = self._state
        if state == PENDING:
            self._queued.append(token)
            return True
        if state == FAILED:
            if self.on_error == "raise":
                raise self._failure()
            # The row allows only stop tokens: accepting one ends the sequence (no livelock).
            if token in self._stops and not (self._log and self._log[-1] == _STOP):
                self._log.append(_STOP)
                return True
            return False
        if self._try_accept(token):
            self._metrics.inc("tokens_accepted")
            return True
        if self._state == FAILED:  # the engine failed on this token
            if self.on_error == "raise":
                raise self._failure()
            return False
        self.num_rejected += 1
        self._metrics.inc("tokens_rejected")
        error = GrammarRejectedToken(token, len(self._log), self._reject_detail(token))
        log.info("grammar rejected a token (on_error=%s): %s", self.on_error, error)
        if self.on_error == "raise":
            self._fail(error)
            raise error
        if self.on_error == "terminate" and not self._forced_stop:
            self._forced_stop = True
            self._error = error
            self._metrics.inc("forced_stops")
        return False

    def _reject_detail(self, token: int) -> str:
        if self._state == TERMINATED or self._forced_stop:
            return "the request is already terminated"
        if self._thinking:
            return "not allowed in the reasoning phase"
        return ""

    def _try_accept(self, token: int) -> bool:
        """Accept ``token`` if allowed; on False nothing changed. Lock held."""
        if self._state == TERMINATED or self._forced_stop:
            if token in self._stops and not (self._log and self._log[-1] == _STOP):
                self._log.append(_STOP)
                return True
            return False
        if self._state != ACTIVE:
            return False
        if self._thinking:
            return self._think_accept(token)
        matcher = self._active_matcher()
        if not matcher.accept(token):
            problem = matcher.error()
            if problem is not None:
                self._engine_failed(problem)
            return False
        self._log.append(_GRAMMAR)
        self._grammar_tokens += 1
        if self._grammar_tokens == 1:
            self._first_token = token
        ids = self._grammar_ids
        if ids is not None:
            if len(ids) < HANDOVER_MAX_TOKENS:
                ids.append(token)
            else:
                self._grammar_ids = None
        if matcher.is_terminated():
            self._state = TERMINATED
        return True

    def _think_accept(self, token: int) -> bool:
        cfg = self.reasoning
        if cfg is None:  # only a request with a reasoning phase thinks
            raise RuntimeError("thinking without a reasoning config")
        end = cfg.think_end_ids
        if token in self._stops:
            return False
        forced = self._forced_think_token()
        if forced is not None and token != forced:
            return False
        self._think_log.append(token)
        self._log.append(_THINK)
        self._think_progress = _suffix_match(self._think_log, end)
        if self._think_progress == len(end):
            self._thinking = False
        return True

    def _rollback_locked(self, n: int, count: bool = True) -> None:
        if n > len(self._log):
            raise ValueError(f"cannot roll back {n} tokens: only {len(self._log)} accepted")
        if self._state == FAILED:
            raise self._failure()
        grammar_n = 0
        for _ in range(n):
            kind = self._log.pop()
            if kind == _GRAMMAR:
                grammar_n += 1
            elif kind == _THINK:
                self._think_log.pop()
                self._thinking = True
        if grammar_n:
            matcher = self._active_matcher()
            matcher.rollback(grammar_n)
            self._grammar_tokens -= grammar_n
            if self._grammar_ids is not None:
                del self._grammar_ids[len(self._grammar_ids) - grammar_n:]
            if self._state == TERMINATED and not matcher.is_terminated():
                self._state = ACTIVE
        if self.reasoning is not None and self._thinking:
            self._think_progress = _suffix_match(self._think_log, self.reasoning.think_end_ids)
        if count:
            self._metrics.inc("rollbacks")

    # -- masks -----------------------------------------------------------------------------
    def fill(self, bitmask: Any, row: int = 0) -> None:
        """Fill ``bitmask[row]`` with this request's next-token mask (single-request path;
        use ``GrammarRuntime.fill_bitmask`` for batches)."""
        # Every step here costs microseconds when the caches are cold, as they are after a
        # forward pass (bench/bench_fill_overhead.py): the common case runs inline.
        seen = self._seen_bitmask
        # The buffer filled last time, same shape and (a tensor) same storage: checked then.
        if (bitmask is seen[0] and type(row) is int and 0 <= row < seen[1]
                and bitmask.shape == seen[2]
                and (seen[3] is None or bitmask.data_ptr() == seen[3])):
            words = seen[4]
        else:
            words = self._see_bitmask(bitmask, row)
        with self._lock:
            if (self._state is ACTIVE and self._grammar_tokens > 1 and not self._thinking
                    and not self._forced_stop
                    and (self._grammar_ids is None or self._compiled.upgraded is None)):
                matcher = self._matcher  # (fill_target's common case)
            else:
                matcher = self.fill_target(bitmask, row)
            if matcher is None:
                return
            matcher.fill(bitmask, row)
            # A dead end allows no token: a few words tell most rows from one (live_words).
            for word in self._live_words:
                if words[row, word]:
                    break
            else:
                self.check_filled(bitmask, row)  # (counts the row)
                return
            if self._matcher_errors and matcher.error() is not None:
                self.check_filled(bitmask, row)

    def _see_bitmask(self, bitmask: Any, row: Any) -> Any:
        """Check a bitmask :meth:`fill` has not seen last time and remember it; returns
        its words as a memoryview (reading one is a shorter path than NumPy's)."""
        self._check_row(bitmask, row)
        arr = as_numpy_bitmask(bitmask, self._rows.words)
        words = arr.data.cast("B").cast("i", arr.shape)
        self._seen_bitmask = (bitmask, arr.shape[0], bitmask.shape,
                              None if type(bitmask) is np.ndarray else bitmask.data_ptr(),
                              words)
        return words

    def _check_row(self, bitmask: Any, row: Any, count: int = 1) -> None:
        """Rows ``row .. row+count-1`` exist in ``bitmask`` (an int32 ``(rows, words)`` CPU
        array of this vocabulary), or TypeError/ValueError naming the values."""
        rows = as_numpy_bitmask(bitmask, self._rows.words).shape[0]
        if isinstance(row, (bool, np.bool_)) or not isinstance(row, (int, np.integer)):
            raise TypeError(f"row must be an int, got {type(row).__name__} ({row!r:.40})")
        if not 0 <= row or row + count > rows:
            span = f"rows {row}..{row + count - 1}" if count > 1 else f"row {row}"
            raise ValueError(f"{span} out of range for a bitmask of {rows} rows")

    def _tokens(self, token_ids: Sequence[Any], what: str) -> list[int]:
        """Every id of ``token_ids`` checked (before any state changes)."""
        if isinstance(token_ids, (str, bytes)) or not isinstance(token_ids, (Sequence,
                                                                              np.ndarray)):
            raise TypeError(f"{what} must be a sequence of ints, got {type(token_ids).__name__}")
        return [self._token(t) for t in token_ids]

    # -- batch fill contract ---------------------------------------------------------------
    @property
    def serial(self) -> int:
        """This request's number in its runtime. A batch fill takes the :attr:`fill_lock`
        of its requests in increasing serial order, so concurrent batches never deadlock."""
        return self._serial

    @property
    def fill_lock(self) -> threading.Lock:
        """The lock that serializes this request's grammar state. Hold it from
        :meth:`fill_target` until the row is filled."""
        return self._lock

    @property
    def engine(self) -> Engine | None:
        """The engine that compiled the grammar (``None`` while pending or failed); a batch
        fill groups the matchers of one engine into one batch call."""
        return self._engine

    def fill_target(self, bitmask: Any, row: int) -> Matcher | None:
        """Prepare ``bitmask[row]`` for a batch fill; :attr:`fill_lock` must be held.

        Returns the matcher that fills the row, or None when the row needs no engine: a
        failed or terminated request's row is written here (stop tokens only), as is a
        thinking request's (everything but the stop tokens, or the forced think-end token),
        as is the row of a request at the grammar's start (no grammar token accepted, or
        all rolled back: ``CompiledGrammar.first_mask``, computed with the compile) or one
        token in (``CompiledGrammar.second_masks``, where the grammar has them); a pending
        request's row is left untouched.

        Hand-over: once the spec's engine upgrade has compiled (``engine_upgrade``), a
        request that has accepted at most :data:`HANDOVER_MAX_TOKENS` grammar tokens moves
        to the upgraded grammar here, before its next mask: a new matcher is fed the tokens
        so far. If that matcher rejects one (an engine's documented subset differs) the
        request keeps its grammar. Read :attr:`engine` after this call.
        """
        if self._state is ACTIVE and not self._thinking and not self._forced_stop:
            if self._grammar_ids is not None and self._compiled.upgraded is not None:
                self._hand_over()
            if self._grammar_tokens < 2:
                known = self._start_mask()
                if known is not None:
                    self._rows.write(bitmask, row, known)
                    return None
            return self._matcher
        self._fill_special(bitmask, row)
        return None

    def _start_mask(self) -> np.ndarray | None:
        """The mask computed with the compile for this request's state, if any: the first
        at the grammar's start, the second after the first token (lock held)."""
        compiled = self._compiled
        if not self._grammar_tokens:
            return compiled.first_mask
        seconds = compiled.second_masks
        return None if seconds is None else seconds.get(self._first_token)

    def hand_over(self) -> None:
        """Move to the spec's upgraded grammar now, where this request still may (see
        :meth:`fill_target`). The upgrade's thread calls it when the upgrade lands, so that
        the move (a new matcher fed the tokens so far) is not paid at a mask."""
        with self._lock:
            if (self._state is ACTIVE and self._grammar_ids is not None
                    and self._compiled.upgraded is not None):
                self._hand_over()

    def _hand_over(self) -> None:
        """Move to the upgraded grammar, tried once (lock held; the request is ACTIVE)."""
        new, ids = self._compiled.upgraded, self._grammar_ids or []
        self._grammar_ids = None
        try:
            matcher = new.engine.new_matcher(new.grammar)
            moved = (all(matcher.accept(t) for t in ids) and matcher.error() is None
                     and not matcher.is_terminated())
        except Exception:  # an engine bug: the request goes on with the grammar it has
            log.exception("hand-over of a request to the %s grammar failed", new.engine_name)
            moved = False
        if not moved:
            self._metrics.inc("handovers_failed")
            return
        self._matcher, self._engine, self._compiled = matcher, new.engine, new
        self._matcher_errors = new.engine.matcher_errors
        self._metrics.inc("handovers")

    def _fill_special(self, bitmask: Any, row: int) -> None:
        """Rows not filled by the grammar engine. Lock held."""
        state = self._state
        if state == PENDING:
            return
        rows = self._rows
        if state in (FAILED, TERMINATED) or self._forced_stop:
            rows.write(bitmask, row, rows.stop_only)
        elif self._thinking:
            forced = self._forced_think_token()
            rows.write(bitmask, row, rows.all_but_stop if forced is None else rows.only(forced))

    def _forced_think_token(self) -> int | None:
        """The think-end token the reasoning budget forces next, if any."""
        cfg = self.reasoning
        if cfg is None or cfg.budget is None:
            return None
        if len(self._think_log) - self._think_progress < cfg.budget:
            return None
        return cfg.think_end_ids[self._think_progress]

    def fill_draft_masks(self, draft_ids: Sequence[int], bitmask: Any, start_row: int = 0) -> int:
        """Masks for speculative verification of ``draft_ids``.

        Row ``start_row + j`` gets the mask after accepting ``draft_ids[:j]`` (j = 0..k, so
        k+1 rows). Drafts are accepted temporarily and rolled back. Returns the number of
        leading drafts the grammar allows; rows past the first invalid draft repeat the mask
        at that position.
        """
        drafts = self._tokens(draft_ids, "draft_ids")
        k = len(drafts)
        self._check_row(bitmask, start_row, k + 1)
        with self._lock:
            if self._state == PENDING:
                raise GrammarNotReady("fill_draft_masks needs a compiled grammar")
            valid = 0
            for j in range(k + 1):
                self._fill_any(bitmask, start_row + j)
                if j == k or not self._try_accept(drafts[j]):
                    break
                valid += 1
            for j in range(valid + 1, k + 1):
                bitmask[start_row + j] = bitmask[start_row + valid]
            if valid:
                self._rollback_locked(valid, count=False)
            return valid

    def fill_draft_tree(
        self,
        retrieve_next_token: Sequence[int],
        retrieve_next_sibling: Sequence[int],
        draft_tokens: Sequence[int],
        bitmask: Any,
        start_row: int = 0,
    ) -> np.ndarray:
        """Masks for a draft token tree (EAGLE/SGLang layout, as xgrammar's
        ``traverse_draft_tree``): node 0 is the root, already accepted; node ``i``'s first
        child is ``retrieve_next_token[i]`` and its next sibling ``retrieve_next_sibling[i]``
        (-1 for none). Row ``start_row + i`` gets the mask after the path root..i. Returns a
        bool array: True for the nodes whose path the grammar allows (rows of other nodes are
        left as they were)."""
        tokens = self._tokens(draft_tokens, "draft_tokens")
        n = len(tokens)
        self._check_row(bitmask, start_row, n)
        nxt = [operator.index(x) for x in retrieve_next_token]
        sib = [operator.index(x) for x in retrieve_next_sibling]
        if len(nxt) != n or len(sib) != n:
            raise ValueError(f"tree arrays must have {n} entries, got {len(nxt)} and {len(sib)}")
        bad = [x for x in nxt + sib if not -1 <= x < n]
        if bad:
            raise ValueError(f"tree links {bad[:5]} out of range [-1, {n})")
        # Children must come after their parent: a link back would loop forever.
        loops = [i for i, x in enumerate(nxt) if x != -1 and x <= i] + [
            i for i, x in enumerate(sib) if x != -1 and x <= i]
        if loops:
            raise ValueError(f"tree links of nodes {loops[:5]} point back (children and "
                             "siblings must have larger indices)")
        valid = np.zeros(n, dtype=bool)
        with self._lock:
            if self._state == PENDING:
                raise GrammarNotReady("fill_draft_tree needs a compiled grammar")
            valid[0] = True
            self._fill_any(bitmask, start_row)
            self._visit_children(0, nxt, sib, tokens, bitmask, valid, start_row)
        return valid

    def _visit_children(self, node: int, nxt: list[int], sib: list[int],
                        tokens: Sequence[int], bitmask: Any, valid: np.ndarray,
                        start_row: int) -> None:
        child = nxt[node]
        while child != -1:
            if self._try_accept(int(tokens[child])):
                valid[child] = True
                self._fill_any(bitmask, start_row + child)
                self._visit_children(child, nxt, sib, tokens, bitmask, valid, start_row)
                self._rollback_locked(1, count=False)
            child = sib[child]

    def _fill_any(self, bitmask: Any, row: int) -> None:
        matcher = self.fill_target(bitmask, row)
        if matcher is not None:
            matcher.fill(bitmask, row)
            self.check_filled(bitmask, row)

    def check_filled(self, bitmask: Any, row: int, *, empty: bool | None = None) -> None:
        """After the engine filled ``bitmask[row]`` (:attr:`fill_lock` held; part of the batch
        contract): if the matcher entered an error state, or the row allows no token at all
        (a dead end of the grammar: every logit would become -inf), fail the request and make
        the row allow only stop tokens. ``empty`` is whether the row is all zeros, when the
        caller already knows (a batch checks all its rows in one NumPy pass)."""
        matcher = self._matcher
        if matcher is None:
            return
        problem = matcher.error()
        if problem is not None:
            self._engine_failed(problem)
        else:
            if empty is None:
                # (count_nonzero: 0.7 us on a 129k-token row, any() 1.3 us)
                empty = not np.count_nonzero(as_numpy_bitmask(bitmask, self._rows.words)[row])
            if not empty:
                return
            self._fail(GrammarEngineError(
                f"the grammar allows no token at position {len(self._log)} (a dead end: no "
                "output can continue the tokens accepted so far)"))
            self._metrics.inc("engine_errors")
            log.warning("request failed: %s", self._error)
        self._fill_special(bitmask, row)

    def jump_forward(self) -> str:
        """Text the grammar forces next (empty while thinking, pending or terminated); the
        engine tokenizes it and passes the ids to :meth:`accept`."""
        with self._lock:
            if self._state is ACTIVE and not self._thinking and not self._forced_stop:
                return self._active_matcher().jump_forward()
            return ""

    # -- asyncio ---------------------------------------------------------------------------
    async def aaccept(self, token_id: int) -> bool:
        """:meth:`accept` in the runtime's executor (keeps the event loop responsive)."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, self.accept, token_id)

    async def await_ready(self) -> Request:
        """Await the compile without blocking the event loop, and without a thread: the
        compile's ready callback wakes the loop (a waiting thread per request would take
        the executor that :meth:`aaccept` and ``afill_bitmask`` run in)."""
        if not self._ready_event.is_set():
            loop = asyncio.get_running_loop()
            ready: asyncio.Future[None] = loop.create_future()
            self.add_ready_callback(lambda _: _wake_loop(loop, ready))
            await ready
        return self


def _wake_loop(loop: asyncio.AbstractEventLoop, ready: asyncio.Future[None]) -> None:
    """Resolve ``ready`` in its loop (from the thread that finished the compile), unless
    the wait was cancelled or the loop is gone."""
    with contextlib.suppress(RuntimeError):  # the loop was closed
        loop.call_soon_threadsafe(_resolve_once, ready)


def _resolve_once(ready: asyncio.Future[None]) -> None:
    if not ready.done():
        ready.set_result(None)


def _suffix_match(log: list[int], end: tuple[int, ...]) -> int:
    """Length of the longest suffix of ``log`` that is a prefix of ``end``."""
    for k in range(min(len(end), len(log)), 0, -1):
        if tuple(log[-k:]) == end[:k]:
            return k
    return 0
