"""`python -m privnet`: the privnet CLI."""

from __future__ import annotations

import sys

from privnet.orchestrator.cli import main

if __name__ == "__main__":
    sys.exit(main())
