"""The export marker of ``export_smollm2_hf`` (what a later call may reuse)."""

from __future__ import annotations

import json


def test_a_full_model_export_serves_a_call_without_weights(tmp_path):
    from portable_guided.runners.hf_export import _MARKER, _is_complete

    def mark(**fields):
        (tmp_path / _MARKER).write_text(json.dumps({"format": 1, **fields}))

    mark()  # an export written before `weights` existed: with weights
    assert _is_complete(str(tmp_path), True) and _is_complete(str(tmp_path), False)
    mark(weights=False)
    assert _is_complete(str(tmp_path), False) and not _is_complete(str(tmp_path), True)
