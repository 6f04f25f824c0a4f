"""privnet from Python: decentralized learning over a real network, privately.

    exp = privnet.Experiment(agents=10, iters=200, strategies="atc", schemes="none,local-ghp")
    result = privnet.simulate(exp)   # or privnet.run(exp), await privnet.run_async(exp)

The public names are `__all__` (README: "Use it from Python"). privnet's own top-level
packages (`agent`, `broker`, `orchestrator`) are imported from beside this one, never from
the working directory, so a module of yours named `agent.py` there does not break privnet
(after `import privnet`, `import agent` gives privnet's; yours works under any other name).
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import sys
import warnings
from pathlib import Path

_HERE = Path(__file__).resolve().parent.parent  # where agent/, broker/, orchestrator/ are
_OWN = ("agent", "broker", "orchestrator")


def _import_own() -> None:
    """Import privnet's own packages from `_HERE`, whatever sys.path says first (a notebook's
    and `python -m`'s sys.path starts with the working directory). A module of the same name
    already imported from elsewhere gives up its place in sys.modules, with a warning."""
    for name in _OWN:
        held = sys.modules.get(name)
        where = getattr(held, "__file__", None) or ""
        if held is not None and Path(where).resolve().is_relative_to(_HERE / name):
            continue
        if held is not None:
            warnings.warn(
                f"privnet: the module {name!r} already imported from {where or held!r} is not "
                f"privnet's; `import {name}` gives privnet's from here on (rename yours to use "
                "both)",
                stacklevel=3,
            )
            for key in [k for k in sys.modules if k == name or k.startswith(name + ".")]:
                del sys.modules[key]
        spec = importlib.machinery.PathFinder.find_spec(name, [str(_HERE)])
        if spec is None or spec.loader is None:
            raise ImportError(f"privnet's package {name!r} is not in {_HERE}: reinstall privnet")
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)


_import_own()

from agent.datasets import Dataset, standardized  # noqa: E402
from agent.losses import LeastSquares, Logistic  # noqa: E402
from agent.problems import Problem, Risk  # noqa: E402
from agent.spec import ConfigError  # noqa: E402
from orchestrator.api import VERSION, Experiment, run, run_async, simulate  # noqa: E402
from orchestrator.result import Result  # noqa: E402
from orchestrator.results import RunFailed  # noqa: E402

__version__ = VERSION

__all__ = [
    "ConfigError",
    "Dataset",
    "Experiment",
    "LeastSquares",
    "Logistic",
    "Problem",
    "Result",
    "Risk",
    "RunFailed",
    "__version__",
    "run",
    "run_async",
    "simulate",
    "standardized",
]
