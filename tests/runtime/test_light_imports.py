"""Importing the runtime (and the bench CLI) pulls in no grammar engine or framework."""

from __future__ import annotations

import json
import os
import subprocess
import sys


def test_runtime_import_is_light():
    code = (
        "import sys, json, portable_guided.runtime, portable_guided.cli.bench, "
        "portable_guided.runtime.redis_cache; "
        "print(json.dumps([m for m in ('xgrammar', 'llguidance', 'torch', 'transformers', "
        "'paddle', 'tiktoken', 'jsonschema', 'prometheus_client', 'redis') "
        "if m in sys.modules]))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env=dict(os.environ, PYTHONPATH=os.getcwd()), timeout=120, check=True)
    assert json.loads(out.stdout) == []
