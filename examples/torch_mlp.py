"""The PyTorch adapter: an MLP on scikit-learn's digits over the real network.

10 agents hold Dirichlet(0.5) shares of the digits' training rows (few classes each), train
the built-in `mlp` problem (privnet.agent.torchnet.MLP: 64 pixels + bias -> 32 ReLU -> 10 classes)
with ATC, once in the clear (`none`) and once with local graph-homomorphic masks
(`local-ghp`), whose masks cancel in every combination: the two runs' models agree up to
the noise grid every weighted term of a local-ghp combination is rounded to (2^-24 with
sigma_g^2 = 0.01; docs/tasks/privacy.md). With `--audit` (the default over a
broker) the wire is recorded and checked. Prints the test accuracy per round, the model's
size, bytes per round and rounds/s.

    python examples/torch_mlp.py                      # over mosquitto, 100 rounds
    python examples/torch_mlp.py --engine memory      # the agents' cores in this process

Needs the `torch` and `sklearn` extras.
"""

from __future__ import annotations

import argparse
import json
import tempfile

import numpy as np

import privnet


def experiment(args: argparse.Namespace) -> privnet.Experiment:
    return privnet.Experiment(
        name="mlp-digits",
        agents=args.agents,
        iters=args.iters,
        problem="mlp",
        params={"hidden": [32]},
        dataset="digits",
        partition="dirichlet:0.5",
        samples=100,
        batch=20,
        mu=0.2,
        rho=0.0,
        feature_noise=0.0,
        strategies="atc",
        schemes="none,local-ghp",
        seed=args.seed,
        broker=args.broker,
        audit=args.engine == "net",
        out=args.out,
    )


def main(argv: list[str] | None = None) -> dict[str, float]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--engine", choices=("net", "memory", "oracle"), default="net")
    parser.add_argument("--broker", default="mosquitto", help="net engine: auto|mosquitto|...")
    parser.add_argument("--agents", type=int, default=10)
    parser.add_argument("--iters", type=int, default=100)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--out", default=None, help="output directory (net: a temporary one)")
    args = parser.parse_args(argv)
    if args.engine == "net" and args.out is None:
        args.out = tempfile.mkdtemp(prefix="privnet-mlp-")
    exp = experiment(args)
    result = privnet.run(exp) if args.engine == "net" else privnet.simulate(exp, args.engine)

    accuracy = {
        s: result.metric("test_accuracy_centroid", "atc", s)[0] for s in ("none", "local-ghp")
    }
    print("round  accuracy(none)  accuracy(local-ghp)")
    for i, (a, b) in enumerate(zip(accuracy["none"], accuracy["local-ghp"], strict=True), 1):
        print(f"{i:5d}  {a:14.4f}  {b:19.4f}")
    plain, masked = result.models["atc/none/0"], result.models["atc/local-ghp/0"]
    gap = float(np.abs(plain - masked).max())
    print(f"model: {plain.shape[-1]} parameters ({8 * plain.shape[-1]:,} bytes as float64)")
    print(f"max |w(local-ghp) - w(none)| over every round and agent: {gap:.3g}")
    numbers = {"dim": float(plain.shape[-1]), "gap": gap}
    for record in result.records:
        scheme = record["scheme"]
        rate, per_round = record.get("rounds_per_s"), record.get("bytes_per_round")
        print(f"{scheme}: {rate:.2f} rounds/s, {per_round or float('nan'):,.0f} bytes/round")
        numbers[f"rounds_per_s.{scheme}"] = float(rate or "nan")
        numbers[f"bytes_per_round.{scheme}"] = float(per_round or "nan")
    if result.out is not None and (result.out / "audit.json").is_file():
        sessions = json.loads((result.out / "audit.json").read_text())["sessions"]
        masked = [s for s in sessions if s["scheme"] == "local-ghp"]
        clean = all(
            s["model_messages"] == s["expected_model_messages"] and s["unmatched"] == 0
            for s in sessions
        ) and all(s["plaintext_messages"] == 0 for s in masked)
        residual = max(s["max_cancellation_residual"]["max"] for s in masked)
        print(
            f"audit: {'clean' if clean else 'NOT CLEAN'} (every model recorded, none clear "
            f"under local-ghp); largest mask cancellation residual {residual:.3g}"
        )
        numbers["audit_clean"], numbers["residual"] = float(clean), float(residual)
    return numbers


if __name__ == "__main__":
    main()
