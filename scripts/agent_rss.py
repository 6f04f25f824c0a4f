"""Peak memory of an agent process at a big model (issue 29), against the issue's bound.

One `privnet run` (mlp on digits with one hidden layer, ATC, sealed, mosquitto, `--seed 1`)
whose process tree is sampled every 0.25 s (`bench.watch`): the largest RSS any agent
process reached, and the bound (max in-degree + 4) x the model's bytes + 150 MB, the
model's bytes being its parameters x the problem's dtype (4 for the float32 torch problems).
Also the largest USS and PSS of an agent (what it holds alone, and its share of the pages
it shares with the zygote and the other agents). One JSON line. Run it under
`flock /work/notes/cpu.lock`.

    python scripts/agent_rss.py --agents 16 --hidden 13158 --iters 3   # 1,000,018 parameters
"""

from __future__ import annotations

import argparse
import contextlib
import json
import shlex
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import psutil

from privnet.orchestrator.bench import _mlp, model_toml, watch
from privnet.orchestrator.experiment.config import ExperimentConfig
from privnet.orchestrator.experiment.instance import Instance


def _unique(proc: subprocess.Popen[bytes], peak: dict[str, int]) -> None:
    """The largest USS and PSS of any agent process, every second (smaps is slow to read):
    what an agent costs beyond the pages it shares with the zygote and the others."""
    root = psutil.Process(proc.pid)
    while proc.poll() is None:
        with contextlib.suppress(psutil.Error):
            for p in root.children(recursive=True):
                with contextlib.suppress(psutil.Error):
                    if "-m privnet.agent" in " ".join(p.cmdline()):
                        full = p.memory_full_info()
                        peak["uss"] = max(peak["uss"], full.uss)
                        peak["pss"] = max(peak["pss"], full.pss)
        time.sleep(1.0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--agents", type=int, default=16)
    parser.add_argument("--hidden", type=int, default=13158, help="mlp's hidden width")
    parser.add_argument("--iters", type=int, default=3)
    parser.add_argument("--scheme", default="local-ghp")
    parser.add_argument("--topology", default="geometric")
    parser.add_argument("--extra", default="", help="more `privnet run` flags, quoted")
    args = parser.parse_args()
    fields = _mlp(args.hidden, args.agents)
    out = Path(tempfile.mkdtemp(prefix="agent-rss-"))
    (out / "model.toml").write_text(model_toml(fields))
    config = ExperimentConfig(
        agents=args.agents, iters=args.iters, topology=args.topology, seed=1, **fields
    )
    instance = Instance.build(config)
    in_degree = max(d for _, d in instance.graph.degree())
    dim = instance.config.dim
    model_bytes = dim * getattr(instance.plugin, "dtype", np.dtype(np.float64)).itemsize
    cmd = [
        *(sys.executable, "-m", "privnet.orchestrator.cli", "run", "--broker", "mosquitto"),
        *("--config", str(out / "model.toml"), "--agents", str(args.agents)),
        *("--iters", str(args.iters), "--topology", args.topology, "--scheme", args.scheme),
        *("--strategy", "atc", "--seed", "1", "--quiet", "--out", str(out / "run")),
        *shlex.split(args.extra),
    ]
    began = time.time()
    proc = subprocess.Popen(cmd, cwd=out, stdout=subprocess.DEVNULL)  # $PYTHONPATH's privnet
    unique: dict[str, int] = {"uss": 0, "pss": 0}
    sampler = threading.Thread(target=_unique, args=(proc, unique), daemon=True)
    sampler.start()
    sample = watch(proc)
    sampler.join()
    if proc.returncode != 0:
        raise SystemExit(f"the run failed (exit {proc.returncode}); see {out / 'run'}")
    result = json.loads((out / "run" / "summary.json").read_text())["results"][0]
    bound = (in_degree + 4) * model_bytes + 150e6
    print(
        json.dumps(
            {
                "when": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(began)),
                "params": result["params"],
                "agents": args.agents,
                "rounds": args.iters,
                "wire_dtype": result["wire_dtype"],
                "max_in_degree": in_degree,
                "model_bytes": model_bytes,
                "rounds_per_s": round(result["rounds_per_s"], 3),
                "peak_agent_rss_mb": round(sample.peak_agent_rss / 1e6, 1),
                "peak_agent_uss_mb": round(unique["uss"] / 1e6, 1),
                "peak_agent_pss_mb": round(unique["pss"] / 1e6, 1),
                "bound_mb": round(bound / 1e6, 1),
                "out": str(out),
            }
        )
    )


if __name__ == "__main__":
    main()
