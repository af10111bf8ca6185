"""The slots for compiles run in this process (``compile_race``): smallest spec first, and
never stuck behind a long compile.

A compile in this process cannot be stopped, so their number is bounded. ``slots``
compiles run at once; one that has run ``patience_s`` is *long* and stops holding up the
others: its slot is free for the next compile, up to ``long_slots`` long compiles (a
long compile here still costs one compile; in a worker, a compile that long is shipped
back serialized, which costs several times more). Waiters are served smallest spec first (a burst
of new schemas gets its quick ones out first, as the worker pool does; a waiter's size
counts less the longer it waits, so a stream of small specs never starves a large one).
A waiter gives up, and its compile goes to a worker, when every place is taken by a long
compile, or when its deadline comes.

>>> lane = LocalLane(slots=1, patience_s=10.0)
>>> first = lane.enter(size=5, deadline=None)
>>> first is not None, lane.enter(size=1, deadline=0.0)   # deadline passed: no slot
(True, None)
>>> lane.leave(first)
>>> lane.enter(size=1, deadline=None) is not None
True
"""

from __future__ import annotations

import itertools
import threading
import time

__all__ = ["LocalLane"]


class LocalLane:
    """Slots for compiles in this process (module doc). Thread-safe.

    ``slots``: compiles starting at once; ``patience_s``: how long a compile runs before it
    counts as long; ``long_slots``: long compiles that may run beside the ``slots`` others;
    ``age_s``: how fast waiting brings a large spec's turn (its size counts half after
    ``age_s``, a third after twice that)."""

    def __init__(self, slots: int, patience_s: float, long_slots: int = 2,
                 age_s: float = 1.0) -> None:
        if not isinstance(slots, int) or slots < 1:
            raise ValueError(f"slots must be an int >= 1, got {slots!r}")
        if not isinstance(long_slots, int) or long_slots < 0:
            raise ValueError(f"long_slots must be an int >= 0, got {long_slots!r}")
        if not patience_s >= 0:
            raise ValueError(f"patience_s must be >= 0 seconds, got {patience_s}")
        if not age_s > 0:
            raise ValueError(f"age_s must be > 0 seconds, got {age_s}")
        self.slots = slots
        self.long_slots = long_slots
        self.patience_s = float(patience_s)
        self.age_s = float(age_s)
        self._cond = threading.Condition()
        self._running: dict[int, float] = {}  # token -> when its compile started (monotonic)
        self._waiting: set[tuple[float, int, int]] = set()  # (arrival, spec size, serial)
        self._tokens = itertools.count()

    def enter(self, size: int, deadline: float | None) -> int | None:
        """Wait for a place; its token (hand it to :meth:`leave`), or None when this compile
        should go to a worker (every place held by a long compile, or ``deadline``,
        monotonic, reached)."""
        me = (time.monotonic(), size, next(self._tokens))
        with self._cond:
            self._waiting.add(me)
            try:
                while True:
                    now = time.monotonic()
                    young = [t for t in self._running.values() if now - t < self.patience_s]
                    room = len(self._running) < self.slots + self.long_slots
                    if len(young) < self.slots and room and me == min(
                            self._waiting, key=lambda w: self._rank(w, now)):
                        token = next(self._tokens)
                        self._running[token] = now
                        return token
                    if (deadline is not None and now >= deadline) or (not room and not young):
                        return None
                    # Something changes when a compile ends (notified), when a young one
                    # turns long, or at the deadline.
                    wake = min([t + self.patience_s for t in young]
                               + ([deadline] if deadline is not None else []), default=now + 1.0)
                    self._cond.wait(max(wake - now, 0.001))
            finally:
                self._waiting.discard(me)
                self._cond.notify_all()  # the next smallest may now be first

    def _rank(self, waiter: tuple[float, int, int], now: float) -> tuple[float, int]:
        """Lower goes first: the spec's size over 1 + the number of ``age_s`` it has
        waited (ties: first come)."""
        arrived, size, serial = waiter
        return size / (1.0 + (now - arrived) / self.age_s), serial

    def leave(self, token: int) -> None:
        """Free the place of a compile that ended."""
        with self._cond:
            self._running.pop(token, None)
            self._cond.notify_all()

    @property
    def running(self) -> int:
        """Compiles holding a place now."""
        with self._cond:
            return len(self._running)
