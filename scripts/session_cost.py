"""What the ways of riding out a broker restart cost on a healthy connection (issue 10).

Variants, each a whole `privnet run` on mosquitto (the orchestrator and every agent):
- clean:       clean sessions, resubscribe after a reconnect (what ships);
- persistent:  clean_session=False (the broker keeps subscriptions and queued QoS-1 messages
               across a client's reconnect) with a fixed client id per connection, which
               the broker replaces by the user's name (the id privnet's brokers give it);
- clean+qos1:  the peer plane (models, key shares) at QoS 1 instead of 0;
- persistent+qos1.
The variants are put in by a `sitecustomize` on PYTHONPATH (no product code knows them),
run interleaved (one of each per repeat, so drifting machine load hits all alike), and the
medians kept: rounds/s, CPU seconds of agents, broker and orchestrator (`privnet bench`'s
sampler), and the broker's own $SYS bytes per round.

    python scripts/session_cost.py --agents 30 --iters 200 --repeats 3 --scheme none
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
from pathlib import Path

from privnet.orchestrator.bench import privnet_run

SITE = """
import os
variant = os.environ.get("PRIVNET_SESSION_VARIANT", "")
if variant:
    import itertools
    import privnet.agent.driver as driver
    import privnet.agent.node as node
    import privnet.agent.protocol as protocol
    import privnet.agent.transport as transport

    if "qos1" in variant:
        node.PEER_QOS = driver.PEER_QOS = 1
        protocol.QOS_OF.update(model=1, keys=1)
    if "persistent" in variant:
        serial = itertools.count()

        class Persistent(transport.GmqttClient):
            def __init__(self, deliver, inflight):
                fixed = f"privnet-{os.getpid()}-{next(serial)}"
                super().__init__(deliver, inflight, client_id=fixed, clean_session=False)

        transport.GmqttClient = Persistent
"""

VARIANTS = ("clean", "persistent", "clean+qos1", "persistent+qos1")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--agents", type=int, default=30)
    p.add_argument("--iters", type=int, default=200)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--scheme", default="none")
    p.add_argument("--variants", default=",".join(VARIANTS))
    p.add_argument("--out", type=Path, default=Path("runs/session-cost"))
    args = p.parse_args()
    variants = args.variants.split(",")
    args.out.mkdir(parents=True, exist_ok=True)
    config = ["--agents", str(args.agents), "--iters", str(args.iters), "--strategy", "atc"]
    config += ["--seed", "1"]
    rows: dict[str, list[dict[str, float]]] = {v: [] for v in variants}
    with tempfile.TemporaryDirectory() as site:
        Path(site, "sitecustomize.py").write_text(SITE)
        path = os.environ.get("PYTHONPATH", "")
        os.environ["PYTHONPATH"] = f"{site}:{path}" if path else site
        for repeat in range(args.repeats):
            for variant in variants:
                os.environ["PRIVNET_SESSION_VARIANT"] = variant if variant != "clean" else ""
                out = args.out / f"{variant}-{repeat}"
                results, sample, wall = privnet_run("mosquitto", config, [args.scheme], out, [])
                res = results[args.scheme]
                summary = json.loads((out / "summary.json").read_text())["config"]
                sys_bytes = summary.get("broker_sys", {})
                row = {
                    "rounds_per_s": res["rounds_per_s"],
                    "cpu_agents": sample.cpu.get("agents", 0.0),
                    "cpu_broker": sample.cpu.get("broker", 0.0),
                    "cpu_orchestrator": sample.cpu.get("orchestrator", 0.0),
                    "sys_rx_per_round": sys_bytes.get("bytes_received", 0) / args.iters,
                    "sys_tx_per_round": sys_bytes.get("bytes_sent", 0) / args.iters,
                    "publish_bytes_per_round": res["bytes_per_round"],
                    "wall": wall,
                }
                rows[variant].append(row)
                print(variant, repeat, {k: round(v, 1) for k, v in row.items()}, flush=True)
    medians = {v: {k: statistics.median(r[k] for r in rs) for k in rs[0]} for v, rs in rows.items()}
    (args.out / "session_cost.json").write_text(json.dumps({"runs": rows, "median": medians}))
    keys = list(next(iter(medians.values())))
    print("variant".ljust(16) + "".join(k[:14].rjust(15) for k in keys))
    for variant, m in medians.items():
        print(variant.ljust(16) + "".join(f"{m[k]:15.1f}" for k in keys))


if __name__ == "__main__":
    main()
