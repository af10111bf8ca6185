"""``python .../portable_guided/runtime/_worker_entry.py RFD WFD``: a compile worker process.

Run by file path, not with ``-m`` and ``PYTHONPATH``: both would put a directory before the
standard library, where a stray ``queue.py`` or a backport in site-packages could shadow it.
The script puts the package root right after the standard library instead (before
site-packages, so the worker imports the same portable_guided as its parent).
"""

import os
import sys


def _fix_path() -> None:
    here = os.path.dirname(os.path.abspath(__file__))
    root = os.path.dirname(os.path.dirname(here))
    # sys.path[0] is this script's folder (portable_guided/runtime): never an import root.
    paths = [p for p in sys.path if os.path.abspath(p or os.curdir) not in (here, root)]
    # After the standard library (the entries before the first site or user package dir).
    sites = [i for i, p in enumerate(paths) if os.path.basename(p) in ("site-packages",
                                                                       "dist-packages")]
    paths.insert(sites[0] if sites else len(paths), root)
    sys.path[:] = paths


if __name__ == "__main__":
    _fix_path()
    from portable_guided.runtime.worker import main

    main()
