"""``python -m portable_guided.runtime._worker_entry RFD WFD``: a compile worker process.

Kept apart from :mod:`portable_guided.runtime.worker` (which the package imports) so that
running it with ``-m`` does not import the same module twice.
"""

from __future__ import annotations

from portable_guided.runtime.worker import main

if __name__ == "__main__":
    main()
