"""Exceptions raised by the grammar runtime.

Every error a caller may want to handle derives from :class:`GrammarError`; input errors
also derive from :class:`ValueError` so generic handlers keep working.
"""

from __future__ import annotations

__all__ = [
    "CompileWorkerLost",
    "GrammarCompileError",
    "GrammarEmptyLanguage",
    "GrammarEngineError",
    "GrammarError",
    "GrammarNotReady",
    "GrammarRejectedToken",
    "GrammarSpecError",
    "GrammarTimeout",
    "RuntimeClosed",
]


class GrammarError(Exception):
    """Base class of every runtime error."""


class GrammarSpecError(GrammarError, ValueError):
    """A grammar spec was rejected before compiling (invalid schema, unsupported keyword...).

    ``pointer`` is the JSON pointer of the offending part of a JSON schema, when known.
    """

    def __init__(self, message: str, pointer: str | None = None) -> None:
        self.pointer = pointer
        where = f" at {pointer}" if pointer else ""
        super().__init__(f"{message}{where}")


class GrammarCompileError(GrammarError):
    """The grammar engine failed to compile a spec; ``engine`` names which one."""

    def __init__(self, message: str, engine: str | None = None) -> None:
        self.engine = engine
        prefix = f"[{engine}] " if engine else ""
        super().__init__(f"{prefix}{message}")


class GrammarTimeout(GrammarCompileError):
    """A compile ran past its time limit (a worker running it was killed). ``started``:
    False when the limit ran out before the compile started (it waited for a worker the
    whole time), which says nothing of the grammar."""

    def __init__(self, message: str, engine: str | None = None, *,
                 started: bool = True) -> None:
        super().__init__(message, engine)
        self.started = started


class GrammarEmptyLanguage(GrammarCompileError):
    """The spec accepts no output at all (an unsatisfiable JSON schema, a grammar whose first
    mask allows nothing): a request for it could produce nothing, so it fails instead of
    serving an empty mask. A caller that must answer anyway knows every output is invalid."""


class CompileWorkerLost(GrammarCompileError):
    """No compile worker could finish the compile: the worker died twice while compiling
    (killed, crashed, out of memory), or none could be started in time. An infrastructure
    fault, so it is never cached as a property of the grammar; the next request for the same
    spec compiles again."""


class GrammarEngineError(GrammarError):
    """The grammar engine failed while serving a request (e.g. llguidance's lexer ran past
    its limits on a token); the request fails per its policy and the compiled grammar is
    dropped from the memory cache."""


class RuntimeClosed(GrammarError):
    """The runtime was closed: pending compiles fail with it, and new requests are refused."""


class GrammarRejectedToken(GrammarError):
    """A token the grammar does not allow was accepted with ``on_error="raise"``."""

    def __init__(self, token_id: int, position: int, detail: str = "") -> None:
        self.token_id = token_id
        self.position = position
        extra = f": {detail}" if detail else ""
        super().__init__(
            f"token {token_id} rejected by the grammar at position {position}{extra}"
        )


class GrammarNotReady(GrammarError):
    """An operation needs the compiled grammar, but it is still compiling."""
