"""Reference helpers for the runtime tests (plain integer arithmetic and NumPy)."""

from __future__ import annotations

import numpy as np


def allowed(bitmask_row: np.ndarray, vocab: int) -> np.ndarray:
    """Token ids whose bit is set in one bitmask row."""
    bits = np.unpackbits(np.ascontiguousarray(bitmask_row).view(np.uint8), bitorder="little")
    return np.nonzero(bits[:vocab])[0]


def is_allowed(bitmask_row: np.ndarray, token: int) -> bool:
    """Whether bit ``token`` is set."""
    word = int(bitmask_row[token // 32]) & 0xFFFFFFFF
    return bool((word >> (token % 32)) & 1)


def first_mask(rt: object, spec: object) -> np.ndarray:
    """The first bitmask row of a new request for ``spec`` on runtime ``rt`` (a copy)."""
    req = rt.new_request(spec).wait(60)  # type: ignore[attr-defined]
    assert not req.failed, req.error
    bm = rt.allocate_bitmask(1)  # type: ignore[attr-defined]
    req.fill(bm, 0)
    return bm[0].copy()


def disk_entries(rt: object, directory: object, first: object, second: object) -> tuple:
    """Compile ``first`` then ``second`` on ``rt`` (a runtime with a disk cache in the
    ``pathlib.Path`` ``directory``); the paths of their two entries, in that order."""
    rt.compile(first)  # type: ignore[attr-defined]
    (first_entry,) = directory.rglob("*.grammar")  # type: ignore[attr-defined]
    rt.compile(second)  # type: ignore[attr-defined]
    (second_entry,) = set(directory.rglob("*.grammar")) - {first_entry}  # type: ignore[attr-defined]
    return first_entry, second_entry


def cpu_seconds(pid: int) -> float | None:
    """User + system CPU time of process ``pid`` from /proc (None if it is gone)."""
    import os

    try:
        with open(f"/proc/{pid}/stat") as fh:
            fields = fh.read().rsplit(")", 1)[1].split()
    except (FileNotFoundError, ProcessLookupError):
        return None
    ticks = os.sysconf("SC_CLK_TCK")
    return (int(fields[11]) + int(fields[12])) / ticks  # utime, stime


def process_gone(pid: int) -> bool:
    """True if ``pid`` no longer runs (exited, or a zombie waiting to be reaped)."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            state = fh.read().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return True
    return state in ("Z", "X")


def wait_gone(pid: int, timeout_s: float = 5.0) -> bool:
    """True once ``pid`` no longer runs, waiting up to ``timeout_s`` (a killed worker's exit
    is waited for in the background: freeing a compile's memory takes a moment)."""
    import time

    deadline = time.monotonic() + timeout_s
    while not process_gone(pid):
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.01)
    return True


def suite_dir():
    """The official JSON Schema Test Suite (draft 2020-12) from the shared data: beside the
    checkout (``../shared``), at ``/work/shared``, or where ``PORTABLE_GUIDED_JSON_SUITE``
    says; a path that does not exist when none is found (tests then skip, naming it)."""
    import os
    from pathlib import Path

    tail = Path("data", "json-schema-test-suite", "draft2020-12")
    here = Path(__file__).resolve().parents[2]
    candidates = [os.environ.get("PORTABLE_GUIDED_JSON_SUITE"), here.parent / "shared" / tail,
                  Path("/work/shared") / tail]
    for cand in candidates:
        if cand and Path(cand).is_dir():
            return Path(cand)
    return here.parent / "shared" / tail


def decide_text(rt, schema, text: str) -> bool | None:
    """None if runtime ``rt``'s engine refused ``schema``, else whether it accepted ``text``
    (its tokens, then the stop token)."""
    from portable_guided.runtime import GrammarSpec

    req = rt.new_request(GrammarSpec.json_schema(schema), on_error="reject").wait(60)
    if req.failed:
        return None
    ids = rt.info.encode(text)
    return req.accept_tokens(ids) == len(ids) and req.accept(rt.info.stop_token_ids[0])
