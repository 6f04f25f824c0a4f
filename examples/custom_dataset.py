"""A dataset of your own: a function with no arguments that returns a `privnet.Dataset`.

`privnet.standardized` builds one from raw features and labels as privnet's datasets are
built (features standardized by the training split, a bias column last, labels 0..C-1).
Every agent calls the function itself and keeps only its own rows (the rows travel in its
sealed Setup, the data never does), so it must give the same arrays everywhere: draw from
a fixed seed, or read a file every agent has. The experiment names it
`custom_dataset:blobs` (module:function), or by an entry point in `privnet.datasets`.

    python examples/custom_dataset.py [--engine oracle|memory] [--iters N]
"""

from __future__ import annotations

import argparse

import numpy as np

import privnet


def blobs() -> privnet.Dataset:
    """Two overlapping Gaussian blobs in 4 dimensions, 600 training and 300 test rows."""
    gen = np.random.default_rng(2024)
    centres = gen.normal(scale=0.5, size=(2, 4))
    y = gen.integers(2, size=900)
    x = centres[y] + gen.normal(size=(900, 4))
    return privnet.standardized(x[:600], y[:600], x[600:], y[600:])


def main(argv: list[str] | None = None) -> privnet.Result:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--engine", choices=("oracle", "memory"), default="oracle")
    parser.add_argument("--iters", type=int, default=200)
    args = parser.parse_args(argv)
    exp = privnet.Experiment(
        problem="logistic",  # two classes
        dataset="custom_dataset:blobs",
        samples=50,
        agents=8,
        iters=args.iters,
        strategies="atc",
        schemes="none,local-ghp",
        mu=0.5,
        seed=5,
    )
    result = privnet.simulate(exp, args.engine)
    error = result.metric("test_error_centroid", "atc", "local-ghp")[0]
    print(f"atc/local-ghp: test error of the centroid {error[0]:.3f} -> {error[-1]:.3f}")
    return result


if __name__ == "__main__":
    main()
