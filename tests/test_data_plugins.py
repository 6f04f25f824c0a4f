"""Partitions deal a dataset's rows as they say, seeded; the PyTorch adapter's gradient is
the module's, and an MLP runs the same on the oracle and the memory engine."""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import numpy as np
import pytest
from conftest import need_torch

import privnet
from privnet.agent import datasets
from privnet.agent.spec import ConfigError
from privnet.orchestrator.experiment import partition

pytest.importorskip("sklearn")
AGENTS, SAMPLES = 10, 60


def dealt(text: str, seed: int = 0) -> list[np.ndarray]:
    labels = datasets.load("digits").y_train
    return partition.rows(text, labels, AGENTS, SAMPLES, np.random.default_rng(seed))


def classes_held(parts: list[np.ndarray]) -> list[int]:
    labels = datasets.load("digits").y_train
    return [len(np.unique(labels[p])) for p in parts]


@pytest.mark.parametrize("text", ["iid", "label-skew:2", "dirichlet:0.5", "quantity-skew:1"])
def test_every_partition_deals_disjoint_rows_the_same_for_a_seed(text: str) -> None:
    parts = dealt(text)
    rows = np.concatenate(parts)
    assert len(parts) == AGENTS and all(len(p) for p in parts)
    assert len(np.unique(rows)) == len(rows) <= AGENTS * SAMPLES  # disjoint
    again, other = dealt(text), dealt(text, seed=1)
    assert all(np.array_equal(a, b) for a, b in zip(parts, again, strict=True))
    assert not all(np.array_equal(a, b) for a, b in zip(parts, other, strict=True))


def test_the_skews_skew() -> None:
    skewed = classes_held(dealt("label-skew:2"))  # 2 shards; one may straddle two classes
    assert max(skewed) <= 4 and np.mean(skewed) <= 3
    assert min(classes_held(dealt("iid"))) == 10
    # Dirichlet(0.1): most agents hold few classes; Dirichlet(100): nearly all hold all ten
    assert np.median(classes_held(dealt("dirichlet:0.1"))) <= 4
    assert np.median(classes_held(dealt("dirichlet:100"))) == 10
    sizes = [len(p) for p in dealt("quantity-skew:0.5")]
    assert max(sizes) > 3 * min(sizes) and [len(p) for p in dealt("iid")] == [SAMPLES] * AGENTS


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("dirichlet", "dirichlet:ALPHA takes the concentration ALPHA > 0"),
        ("label-skew:1.5", "label-skew:C takes C"),
        ("quantity-skew:-1", "quantity-skew:BETA takes the concentration BETA > 0"),
        ("no-such", "unknown partition 'no-such'"),
    ],
)
def test_a_bad_partition_says_what_is_wrong(text: str, words: str) -> None:
    with pytest.raises(ConfigError, match=words):
        dealt(text)


def test_too_many_rows_asked_for() -> None:
    labels = datasets.load("digits").y_train
    with pytest.raises(ConfigError, match="exceed the 1347 training rows; lower samples"):
        partition.rows("iid", labels, 100, 20, np.random.default_rng(0))


def test_the_torch_adapter_gives_the_modules_gradient() -> None:
    """Central differences of the risk's value agree with its gradient, for K = 2 models."""
    need_torch()
    from privnet.torch import MLP

    problem = MLP(hidden=(4,), rho=0.01, dtype="float64")  # float32's: too coarse to difference
    data = datasets.load("wine")
    x, y = data.x_train[:30], data.y_train[:30]
    risk = problem.risk(x, y, data.classes)
    gen = np.random.default_rng(3)
    w = gen.normal(scale=0.5, size=(2, problem.dim(x.shape[1], data.classes)))
    assert_gradient_is_the_difference(risk, w, gen)


def test_an_mlp_runs_the_same_on_the_oracle_and_the_memory_engine() -> None:
    need_torch()
    exp = privnet.Experiment(
        agents=4,
        iters=4,
        problem="mlp",
        params={"hidden": [8]},
        dataset="wine",
        partition="dirichlet:1",
        samples=25,
        batch=10,
        strategies="atc",
        schemes="none,local-ghp",
        seed=2,
    )
    oracle, memory = privnet.simulate(exp, "oracle"), privnet.simulate(exp, "memory")
    for scheme in ("none", "local-ghp"):
        session = f"atc/{scheme}/0"
        np.testing.assert_allclose(memory.models[session], oracle.models[session], atol=1e-12)
        accuracy = memory.metric("test_accuracy_centroid", "atc", scheme)
        np.testing.assert_allclose(accuracy, oracle.metric("test_accuracy_centroid", "atc", scheme))
    assert memory.models["atc/none/0"].shape == (4, 4, (14 * 8 + 8) + (8 * 3 + 3))


def assert_gradient_is_the_difference(risk: Any, w: np.ndarray, gen: np.random.Generator) -> None:
    """`risk.gradient` at 8 drawn coordinates equals the central difference of `risk.value`."""
    grad = risk.gradient(w, None)
    assert grad.shape == w.shape
    for m in gen.choice(w.shape[1], size=8, replace=False):
        step = np.zeros_like(w)
        step[:, m] = 1e-6
        numeric = (risk.value(w + step, None) - risk.value(w - step, None)) / 2e-6
        np.testing.assert_allclose(grad[:, m], numeric, rtol=1e-5, atol=1e-8)


@pytest.mark.parametrize(
    "name, loader", [("digits", "load_digits"), ("breast-cancer", "load_breast_cancer"),
                     ("wine", "load_wine")],
)  # fmt: skip
def test_the_bundled_datasets_are_scikit_learns_without_importing_it(
    name: str, loader: str
) -> None:
    """An agent reads scikit-learn's files itself: importing it (scipy, pandas) cost every
    agent process about 140 MB and a second of start-up."""
    code = (
        "import sys; from privnet.agent import datasets; "
        f"d = datasets.load({name!r}); "
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('sklearn', 'scipy', 'pandas')))"
    )
    imported = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout.strip()
    assert imported == "[]"
    from sklearn import datasets as bundled

    data = getattr(bundled, loader)()
    mine, theirs = (
        datasets.load(name),
        datasets.split(np.asarray(data.data, dtype=float), data.target),
    )
    for field in ("x_train", "y_train", "x_test", "y_test"):
        a, b = getattr(mine, field), getattr(theirs, field)
        assert a.dtype == b.dtype and np.array_equal(a, b), field
    assert mine.classes == theirs.classes
