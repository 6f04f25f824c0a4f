"""A LeNet-like CNN of 121,354 parameters on scikit-learn's digits, in float32, on the u4 wire.

16 agents on a 3-regular graph hold iid shares of the digits' training rows (84 each) and
train the built-in `cnn` problem (privnet.agent.torchnet.CNN: 8x8 images -> 3x3 conv, 32
channels -> pool -> 3x3 conv, 64 channels -> pool -> 384 ReLU -> 10 classes) with ATC, once
in the clear (`none`) and once with local graph-homomorphic masks (`local-ghp`). The module
runs in float32, so its releases take the u4 wire (4 bytes a parameter, on the noise
lattice; docs/tasks/big-models.md). The two runs differ only by the lattice rounding of
`none`'s releases (2^-24; local-ghp's sums are on the lattice already), which training
carries forward: measured, 16 agents x 150 rounds, the models within 2e-3 of each other and
the test accuracies within one test image (both 0.962 at the end). A model of 121,354
parameters is 8 chunks on the peer plane. Prints the test accuracy every tenth of
the run, the model's size, the largest gap between the two runs' models, and per scheme
rounds/s and bytes per round.

    python examples/torch_cnn.py                      # over mosquitto, 150 rounds
    python examples/torch_cnn.py --engine memory      # the agents' cores in this process
    python examples/torch_cnn.py --size 1m --local-steps 2   # 1,011,722 parameters, E = 2

Needs the `torch` and `sklearn` extras.
"""

from __future__ import annotations

import argparse
import tempfile

import numpy as np

import privnet

# The model sizes of docs/tasks/big-models.md's table: (channels, hidden) on 8x8 digits
SIZES = {
    "10k": ([8, 16], [128]),  # 10,858 parameters: one frame
    "100k": ([32, 64], [384]),  # 121,354: 8 chunks at u4
    "1m": ([64, 128], [1792]),  # 1,011,722: 62 chunks at u4
}


def experiment(args: argparse.Namespace) -> privnet.Experiment:
    channels, hidden = SIZES[args.size]
    return privnet.Experiment(
        name="cnn-digits",
        agents=args.agents,
        iters=args.iters,
        problem="cnn",
        params={"channels": channels, "hidden": hidden},
        local_steps=args.local_steps,
        dataset="digits",
        partition="iid",
        samples=1347 // args.agents,  # every training row dealt out once
        batch=32,
        mu=0.1,
        rho=0.0,
        feature_noise=0.0,
        topology="regular:3",
        strategies="atc",
        schemes="none,local-ghp",
        seed=args.seed,
        broker=args.broker,
        out=args.out,
    )


def main(argv: list[str] | None = None) -> dict[str, float]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--engine", choices=("net", "memory", "oracle"), default="net")
    parser.add_argument("--broker", default="mosquitto", help="net engine: auto|mosquitto|...")
    parser.add_argument("--agents", type=int, default=16)
    parser.add_argument("--iters", type=int, default=150)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--size", choices=tuple(SIZES), default="100k", help="the model")
    parser.add_argument("--local-steps", type=int, default=1, help="SGD steps a round (E)")
    parser.add_argument("--out", default=None, help="output directory (net: a temporary one)")
    args = parser.parse_args(argv)
    if args.engine == "net" and args.out is None:
        args.out = tempfile.mkdtemp(prefix="privnet-cnn-")
    exp = experiment(args)
    result = privnet.run(exp) if args.engine == "net" else privnet.simulate(exp, args.engine)

    accuracy = {
        s: result.metric("test_accuracy_centroid", "atc", s)[0] for s in ("none", "local-ghp")
    }
    plain, masked = result.models["atc/none/0"], result.models["atc/local-ghp/0"]
    # the rounds with models (every K of --models-every), about a tenth of the run apart
    held = [i for i in range(1, args.iters + 1) if np.isfinite(accuracy["none"][i - 1])]
    every = max(1, len(held) // 10)
    # round by round: a 1M-parameter run's models are only paged in at the rounds with models
    apart = {i: float(np.max(np.abs(plain[i - 1] - masked[i - 1]))) for i in held}
    print("round  accuracy(none)  accuracy(local-ghp)  max |w(local-ghp) - w(none)|")
    for i in sorted({*held[every - 1 :: every], held[-1]}):
        print(
            f"{i:5d}  {accuracy['none'][i - 1]:14.4f}  {accuracy['local-ghp'][i - 1]:19.4f}"
            f"  {apart[i]:.3g}"
        )
    gap = max(apart.values())
    print(f"model: {plain.shape[-1]} parameters")
    print(f"max |w(local-ghp) - w(none)| over the rounds with models and agents: {gap:.3g}")
    numbers = {"dim": float(plain.shape[-1]), "gap": gap}
    for record in result.records:
        scheme, wire = record["scheme"], record.get("wire_dtype")
        rate, per_round = record.get("rounds_per_s"), record.get("bytes_per_round")
        print(
            f"{scheme}: {rate:.2f} rounds/s, {per_round or float('nan'):,.0f} bytes/round "
            f"({wire} wire, {record.get('bytes_per_param_per_model_frame') or 0:.4f} bytes "
            "a parameter a model frame)"
        )
        numbers[f"rounds_per_s.{scheme}"] = float(rate or "nan")
        numbers[f"bytes_per_round.{scheme}"] = float(per_round or "nan")
        numbers[f"accuracy.{scheme}"] = float(accuracy[scheme][-1])
    return numbers


if __name__ == "__main__":
    main()
