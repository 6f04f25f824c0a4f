"""privnet from a Jupyter kernel, driven as a notebook front end drives it (jupyter_client):
an Experiment simulated on the memory engine and run over mosquitto, both with `run` (the
kernel's event loop is running: the network runs on a thread of its own) and `await
run_async` (on the kernel's loop), the Results as data frames and figures; beside the
notebook a module of the user's named agent.py, which stays the user's and is never privnet's."""

from __future__ import annotations

import json
import os
import queue
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import need_mosquitto

jupyter_client = pytest.importorskip("jupyter_client")
pytest.importorskip("ipykernel")

ROOT = Path(__file__).resolve().parent.parent
# The kernel finds this checkout's privnet after the notebook's directory, as it finds an
# installed one (in site-packages); its agent processes get it from PYTHONPATH.
LAUNCH = (
    "import sys\n"
    "while {root!r} in sys.path: sys.path.remove({root!r})\n"
    "sys.path.append({root!r})\n"
    "from ipykernel.kernelapp import launch_new_instance\n"
    "launch_new_instance()"
)
TIMEOUT = 180.0  # s for one cell (a net run: broker, 4 agent processes, 2 sessions)

SETUP = """
import dataclasses, json
import numpy as np
import agent as mine  # the notebook's own agent.py, imported first
import privnet
exp = privnet.Experiment(
    agents=4, iters=12, strategies="atc", schemes="none,local-ghp", seed=2, broker="mosquitto"
)
"""
CELLS = {
    "memory": 'memory = privnet.simulate(exp, "memory")',
    "run": 'net = privnet.run(dataclasses.replace(exp, out="net"))',
    "run_async": 'again = await privnet.run_async(dataclasses.replace(exp, out="again"))',
    "check": """
frame = memory.frame()
print(json.dumps({
    "mine": mine.__file__,
    "privnet_agent": privnet.Experiment.__module__ and __import__("privnet.agent").agent.__file__,
    "engines": [memory.engine, net.engine, again.engine],
    "columns": list(frame.columns),
    "rows": len(frame),
    "net_rows": len(net.frame()),
    "summary_rows": len(net.summary_frame()),
    "gap": max(float(np.abs(memory.models[k] - r.models[k]).max())
               for r in (net, again) for k in memory.models),
    "figures": sorted(net.plot()),
}))
""",
    "plot": '%matplotlib inline\ndisplay(memory.plot()["msd.png"])',  # Figures, no pyplot
}


class Kernel:
    """A running kernel and a client of it; `execute` runs a cell and gives its outputs."""

    def __init__(self, manager: Any, client: Any) -> None:
        self.manager, self.client = manager, client

    def execute(self, code: str) -> list[dict[str, Any]]:
        outputs: list[dict[str, Any]] = []
        reply = self.client.execute_interactive(
            code, timeout=TIMEOUT, output_hook=lambda msg: outputs.append(msg)
        )
        errors = [m["content"] for m in outputs if m["msg_type"] == "error"]
        assert reply["content"]["status"] == "ok", "\n".join(
            "\n".join(e["traceback"]) for e in errors
        ) or str(reply["content"])
        return outputs


@pytest.fixture(scope="module")
def kernel(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Kernel]:
    """A python kernel of this interpreter, started in a notebook's directory that holds
    a user's agent.py (first on the kernel's sys.path, as a notebook's directory is)."""
    from jupyter_client.kernelspec import KernelSpecManager
    from jupyter_client.manager import KernelManager

    home = tmp_path_factory.mktemp("notebook")
    (home / "agent.py").write_text("WHO = 'the user'\n")
    specs = home / "kernels" / "privnet-test"
    specs.mkdir(parents=True)
    argv = [sys.executable, "-c", LAUNCH.format(root=str(ROOT)), "-f", "{connection_file}"]
    (specs / "kernel.json").write_text(json.dumps({"argv": argv, "language": "python"}))
    manager = KernelManager(
        kernel_name="privnet-test",
        kernel_spec_manager=KernelSpecManager(kernel_dirs=[str(home / "kernels")]),
    )
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)
    manager.start_kernel(cwd=str(home), env={**os.environ, "PYTHONPATH": path})
    client = manager.client()
    client.start_channels()
    try:
        client.wait_for_ready(timeout=60)
        yield Kernel(manager, client)
    finally:
        client.stop_channels()
        manager.shutdown_kernel(now=True)


def _stdout(outputs: list[dict[str, Any]]) -> str:
    return "".join(
        m["content"]["text"]
        for m in outputs
        if m["msg_type"] == "stream" and m["content"]["name"] == "stdout"
    )


def test_an_experiment_from_a_notebook(kernel: Kernel) -> None:
    need_mosquitto()
    kernel.execute(SETUP)
    for name in ("memory", "run", "run_async"):
        kernel.execute(CELLS[name])
    seen = json.loads(_stdout(kernel.execute(CELLS["check"])).strip().splitlines()[-1])
    assert Path(seen["mine"]).parent.name.startswith("notebook")  # the user's agent.py ...
    assert Path(seen["privnet_agent"]) == ROOT / "privnet" / "agent" / "__init__.py"  # privnet's
    assert seen["engines"] == ["memory", "net", "net"]
    assert seen["columns"][:6] == [
        "strategy",
        "scheme",
        "repeat",
        "iter",
        "msd_centroid",
        "msd_avg",
    ]
    assert seen["rows"] == seen["net_rows"] == 2 * 12 and seen["summary_rows"] == 2
    assert seen["gap"] < 1e-12  # the network computed what the memory engine did
    assert seen["figures"] == ["agents.png", "msd.png", "topology.png"]
    shown = [m for m in kernel.execute(CELLS["plot"]) if m["msg_type"] == "display_data"]
    assert len(shown) == 1 and shown[0]["content"]["data"]["image/png"]


def test_the_kernel_survives_a_bad_experiment(kernel: Kernel) -> None:
    """A setting that cannot be is a ConfigError in the cell, not a dead kernel."""
    outputs = kernel.client.execute_interactive(
        "import privnet; privnet.Experiment(agents=0)", timeout=TIMEOUT
    )
    assert outputs["content"]["status"] == "error"
    assert outputs["content"]["ename"] == "ConfigError"
    with pytest.raises(queue.Empty):
        kernel.client.get_iopub_msg(timeout=0.1)  # nothing left behind
    assert _stdout(kernel.execute("print(1 + 1)")).strip() == "2"
