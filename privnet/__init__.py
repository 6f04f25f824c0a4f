"""privnet from Python: decentralized learning over a real network, privately.

    exp = privnet.Experiment(agents=10, iters=200, strategies="atc", schemes="none,local-ghp")
    result = privnet.simulate(exp)   # or privnet.run(exp), await privnet.run_async(exp)

The public names are `__all__`; the parts live under this one import name (`privnet.agent`,
`privnet.broker`, `privnet.orchestrator`). The names load on first use, so an agent process
or the broker, which import their own part of the package, do not load the orchestrator.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from privnet.agent.datasets import Dataset, standardized
    from privnet.agent.losses import LeastSquares, Logistic
    from privnet.agent.problems import Problem, Risk
    from privnet.agent.spec import ConfigError
    from privnet.orchestrator.api import Experiment, run, run_async, simulate
    from privnet.orchestrator.errors import RunFailed
    from privnet.orchestrator.result import Result

_WHERE = {  # public name -> the module that defines it
    "ConfigError": "privnet.agent.spec",
    "Dataset": "privnet.agent.datasets",
    "standardized": "privnet.agent.datasets",
    "LeastSquares": "privnet.agent.losses",
    "Logistic": "privnet.agent.losses",
    "Problem": "privnet.agent.problems",
    "Risk": "privnet.agent.problems",
    "Experiment": "privnet.orchestrator.api",
    "run": "privnet.orchestrator.api",
    "run_async": "privnet.orchestrator.api",
    "simulate": "privnet.orchestrator.api",
    "Result": "privnet.orchestrator.result",
    "RunFailed": "privnet.orchestrator.errors",
}

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


def __getattr__(name: str) -> Any:
    if name == "__version__":
        return importlib.import_module("privnet.orchestrator.api").VERSION
    if name in _WHERE:
        value = getattr(importlib.import_module(_WHERE[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'privnet' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
