import sys

from portable_guided.cli import main

sys.exit(main())
