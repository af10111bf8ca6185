"""The compile worker imports the standard library before anything next to the package."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import portable_guided


def test_module_beside_the_package_does_not_shadow_the_standard_library(tmp_path: Path) -> None:
    # A package root holding portable_guided and a `queue.py` (as a site-packages with a
    # stray module, or a checkout with a script of that name, would). The worker imports
    # `queue`; it must get the standard library's.
    root = tmp_path / "root"
    root.mkdir()
    (root / "portable_guided").symlink_to(Path(portable_guided.__file__).parent)
    (root / "queue.py").write_text("raise ImportError('shadowed the standard library')\n")
    script = textwrap.dedent(f"""
        import json, sys
        sys.path.append({str(root)!r})  # after the standard library, as installed packages
        import portable_guided
        assert portable_guided.__file__.startswith({str(root)!r}), portable_guided.__file__
        from portable_guided.runtime.worker import WorkerPool
        pool = WorkerPool(lambda: {{}}, size=1, start_timeout_s=60)
        try:
            status, text, _ = pool.run("none", {{}}, timeout_s=60)
        except Exception as exc:
            status, text = "failed", f"{{type(exc).__name__}}: {{exc}}"
        finally:
            pool.close()
        print(json.dumps([status, str(text), str(pool.start_error)]))
    """)
    cwd = tmp_path / "elsewhere"
    cwd.mkdir()
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    done = subprocess.run([sys.executable, "-c", script], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=180, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    status, text, start_error = json.loads(done.stdout.strip().splitlines()[-1])
    # The worker started and answered the job (an unknown engine: a KeyError from the worker).
    assert (status, text, start_error) == ("error", "KeyError: 'none'", "None")
