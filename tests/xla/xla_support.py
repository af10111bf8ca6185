"""Counting what XLA does: compilations and host<->device transfers, from torch_xla's metrics.

torch_xla records every compilation (counter ``UncachedCompile``, metric ``CompileTime``), every
host-to-device upload (metric ``TransferToDeviceTime``, bytes in ``OutboundData``) and every
device-to-host download (``TransferFromDeviceTime``, bytes in ``InboundData``). Tests take a
snapshot before and after the code under test and compare the difference with exact numbers.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import numpy as np


@dataclass(frozen=True)
class XlaCounts:
    """Cumulative XLA activity of this process (subtract two snapshots for a window)."""

    compiles: int
    compile_cache_hits: int
    h2d_transfers: int
    h2d_bytes: int
    d2h_transfers: int
    d2h_bytes: int

    def __sub__(self, other: XlaCounts) -> XlaCounts:
        return XlaCounts(*(getattr(self, f.name) - getattr(other, f.name) for f in fields(self)))


def _samples(name: str) -> tuple[int, int]:
    import torch_xla.debug.metrics as met

    data = met.metric_data(name)
    return (int(data[0]), int(data[1])) if data else (0, 0)


def xla_counts() -> XlaCounts:
    """A snapshot of the process-wide XLA metrics."""
    import torch_xla.debug.metrics as met

    _, h2d_bytes = _samples("OutboundData")
    d2h, d2h_bytes = _samples("InboundData")
    return XlaCounts(
        compiles=int(met.counter_value("UncachedCompile") or 0),
        compile_cache_hits=int(met.counter_value("CachedCompile") or 0),
        h2d_transfers=_samples("TransferToDeviceTime")[0],
        h2d_bytes=h2d_bytes,
        d2h_transfers=max(_samples("TransferFromDeviceTime")[0], d2h),
        d2h_bytes=d2h_bytes,
    )


def graph_hash(tensor) -> bytes:
    """The hash of the pending (not yet executed) graph that computes ``tensor``: two steps with
    the same hash run the same compiled executable."""
    import torch_xla

    return bytes(torch_xla._XLAC._get_graph_hash([tensor]))


def random_bitmask(rng: np.random.Generator, rows: int, words: int) -> np.ndarray:
    """Random int32 words with the sign bit set about half the time, plus the two extremes."""
    mask = rng.integers(-(2**31), 2**31, size=(rows, words), dtype=np.int64).astype(np.int32)
    if rows >= 3:
        mask[0] = -1  # all allowed
        mask[1] = 0  # all masked
    return mask


def expected_mask(logits: np.ndarray, bitmask: np.ndarray, rows, vocab_size: int | None = None
                  ) -> np.ndarray:
    """Vectorized check (independent of the kernels): ``logits`` with the tokens that
    ``bitmask`` disallows in ``rows`` set to -inf, for columns below ``vocab_size`` (default:
    the logits' full width)."""
    out = logits.copy()
    columns = logits.shape[1] if vocab_size is None else vocab_size
    bits = np.unpackbits(bitmask.view(np.uint8), bitorder="little", axis=-1).astype(bool)
    for row in rows:
        out[row, :columns][~bits[row, :columns]] = -np.inf
    return out
