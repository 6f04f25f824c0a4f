"""`python -m privnet`: the privnet CLI, with privnet's own packages imported first (a
module named agent.py in the working directory, which `-m` puts first on sys.path, does
not shadow them)."""

from __future__ import annotations

import sys

import privnet  # noqa: F401  (imports agent, broker, orchestrator from beside it)
from orchestrator.cli import main

if __name__ == "__main__":
    sys.exit(main())
