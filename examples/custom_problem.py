"""A problem of your own: Huber regression on the paper's linear data (section V-A).

A Problem is a class built from keyword arguments (numbers, strings, booleans): `dim` says
how many parameters the model has, `risk` gives one agent's local risk J_p on its samples,
whose `gradient` (and here `value`) take K models at once, (K, M). Without `optimum`,
privnet finds the reference w^o from the risks by L-BFGS. The experiment names it
`custom_problem:Huber` (module:Class; every agent imports the module by that name, so it
must be importable where they run: here, beside this file), or by an entry point in the
group `privnet.problems` once it is installed.

    python examples/custom_problem.py [--engine oracle|memory] [--iters N]
"""

from __future__ import annotations

import argparse

import numpy as np

import privnet


class Huber:
    """J_p(w) = 1/N sum_n huber_delta(d_n - u_n^T w) + rho ||w||^2: least squares near the
    fit, absolute error in the tails (robust to outlying targets)."""

    def __init__(self, delta: float = 1.0, rho: float = 0.01) -> None:
        if not delta > 0:
            raise ValueError(f"delta must be > 0, got {delta}")
        self.delta, self.rho = delta, rho

    def dim(self, features: int, classes: int) -> int:
        return features

    def risk(self, x: np.ndarray, y: np.ndarray, classes: int) -> HuberRisk:
        return HuberRisk(self, x, y)


class HuberRisk:
    def __init__(self, problem: Huber, x: np.ndarray, y: np.ndarray) -> None:
        self.problem, self.x, self.y = problem, x, y

    def _residuals(self, w: np.ndarray, rows: np.ndarray | None) -> tuple[np.ndarray, ...]:
        x, y = (self.x, self.y) if rows is None else (self.x[rows], self.y[rows])
        return x, y[:, None] - x @ w.T  # (B, K)

    def gradient(self, w: np.ndarray, rows: np.ndarray | None) -> np.ndarray:
        x, r = self._residuals(w, rows)
        slope = np.clip(r, -self.problem.delta, self.problem.delta)
        return -(slope.T @ x) / len(x) + 2.0 * self.problem.rho * w

    def value(self, w: np.ndarray, rows: np.ndarray | None) -> np.ndarray:
        _, r = self._residuals(w, rows)
        d, a = self.problem.delta, np.abs(r)
        loss = np.where(a <= d, 0.5 * r**2, d * (a - 0.5 * d)).mean(axis=0)
        return loss + self.problem.rho * np.sum(w**2, axis=-1)


def main(argv: list[str] | None = None) -> privnet.Result:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--engine", choices=("oracle", "memory"), default="oracle")
    parser.add_argument("--iters", type=int, default=300)
    args = parser.parse_args(argv)
    exp = privnet.Experiment(
        problem="custom_problem:Huber",
        params={"delta": 0.5},
        dataset="linear",
        agents=10,
        iters=args.iters,
        strategies="atc",
        schemes="none,local-ghp",
        mu=0.4,
        seed=3,
    )
    result = privnet.simulate(exp, args.engine)
    for scheme in ("none", "local-ghp"):
        db = 10 * np.log10(result.metric("msd_centroid", "atc", scheme)[0, -1])
        print(f"atc/{scheme}: MSD of the centroid after {args.iters} rounds {db:.1f} dB")
    return result


if __name__ == "__main__":
    main()
