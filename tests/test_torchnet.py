"""The PyTorch adapter runs a module in its own dtype (float32 by default) on flat buffers,
and a float32 problem takes the u4 wire unless the run needs f8; the `cnn` problem sizes
itself from square images and refuses rows that are not."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import need_torch
from test_data_plugins import assert_gradient_is_the_difference

import privnet
from privnet.agent import datasets
from privnet.agent.spec import ConfigError, WireDtype
from privnet.orchestrator.experiment.instance import Instance

pytest.importorskip("sklearn")


def test_the_module_runs_in_float32_on_one_flat_buffer() -> None:
    """Parameters and gradients are views of two flat float32 buffers that backward() fills
    in place; the float32 gradient is the float64 module's to float32's precision."""
    need_torch()
    from privnet.torch import MLP

    data = datasets.load("digits")
    x, y = data.x_train[:40], data.y_train[:40]
    single, double = MLP(hidden=(16,)), MLP(hidden=(16,), dtype="float64")
    risk = single.risk(x, y, data.classes)
    flat = risk.flat
    assert flat.weights.dtype.is_floating_point and flat.w.dtype == np.float32
    w0 = single.initial(x.shape[1], data.classes)
    assert w0.dtype == np.float64 and np.array_equal(w0, double.initial(x.shape[1], 10))
    w = w0 + np.random.default_rng(1).normal(scale=0.1, size=(2, len(w0)))
    grad = risk.gradient(w, np.arange(20))
    base, end = flat.weights.data_ptr(), flat.weights.data_ptr() + 4 * len(w0)
    gbase = flat.grads.data_ptr()
    for p in risk.net.parameters():
        assert base <= p.data_ptr() < end and p.grad is not None
        assert gbase <= p.grad.data_ptr() < gbase + 4 * len(w0)  # still the buffer's
    exact = double.risk(x, y, data.classes).gradient(w, np.arange(20))
    np.testing.assert_allclose(grad, exact, rtol=0, atol=1e-6 * np.abs(exact).max())
    assert not np.array_equal(grad, exact)  # float32 it was
    again = risk.gradient(w, np.arange(20))  # the buffers are zeroed between models
    assert np.array_equal(again, grad)


def test_a_loss_the_gradient_took_is_not_computed_again() -> None:
    """value() after gradient() on the same models and rows is the forward pass's own loss
    (what a fresh risk computes); other models or rows are computed, not taken stale."""
    need_torch()
    from privnet.torch import MLP

    data = datasets.load("digits")
    x, y = data.x_train[:40], data.y_train[:40]
    problem = MLP(hidden=(16,), rho=0.01)
    risk, fresh = problem.risk(x, y, data.classes), problem.risk(x, y, data.classes)
    w = problem.initial(x.shape[1], data.classes)[None] + 0.1
    risk.gradient(w, None)
    calls = []
    forward = risk.net.forward
    risk.net.forward = lambda *a: calls.append(1) or forward(*a)  # type: ignore[method-assign]
    np.testing.assert_array_equal(risk.value(w.copy(), None), fresh.value(w, None))
    assert calls == []  # taken from the gradient's pass
    other = w + 0.5
    np.testing.assert_array_equal(risk.value(other, None), fresh.value(other, None))
    np.testing.assert_array_equal(risk.value(w, np.arange(9)), fresh.value(w, np.arange(9)))
    assert len(calls) == 2


def test_a_score_in_slices_of_rows_is_the_whole_batchs() -> None:
    """`score` runs SCORED_AT_ONCE rows per forward pass (a wide layer's activations stay
    a few MB): the accuracy is the one forward pass over every row gives, row count not a
    multiple of the slice included."""
    need_torch()
    import torch

    from privnet.agent.torchnet import SCORED_AT_ONCE
    from privnet.torch import MLP

    data = datasets.load("digits")
    x, y = data.x_test[: 2 * SCORED_AT_ONCE + 7], data.y_test[: 2 * SCORED_AT_ONCE + 7]
    problem = MLP(hidden=(16,))
    w0 = problem.initial(x.shape[1], data.classes)
    w = w0 + np.random.default_rng(2).normal(scale=0.3, size=(3, len(w0)))
    net = problem.flat(x.shape[1], data.classes)
    whole = []
    for model in w:
        net.load(model)
        with torch.no_grad():
            whole.append((net.net(problem.tensor(x)).argmax(dim=1).numpy() == y).mean())
    assert list(problem.score(w, x, y, data.classes)) == whole
    assert len(set(whole)) > 1  # the models differ, and so do their scores


def test_a_dtype_it_cannot_run_in_is_refused() -> None:
    need_torch()
    from privnet.torch import CNN, MLP

    for bad in ("float16", "int32", "fast"):
        with pytest.raises(ConfigError, match="runs in one of float32, float64"):
            MLP(dtype=bad)
    assert CNN(dtype="float64").dtype == np.float64 and CNN().dtype == np.float32


def build(**settings: object) -> Instance:
    base: dict[str, object] = {"agents": 4, "iters": 2, "dataset": "digits", "problem": "mlp"}
    return Instance.build(privnet.Experiment(**{**base, **settings}).config)  # type: ignore[arg-type]


def test_a_float32_problem_takes_the_u4_wire_where_it_is_built() -> None:
    """u4 by default for float32 (f8 for float64, or when asked); where u4 is not built yet
    (a time-varying topology, attackers) the default is f8, and asking for u4 is refused."""
    need_torch()
    assert build().wire is WireDtype.U4
    assert build(params={"dtype": "float64"}).wire is WireDtype.F8
    assert build(wire_dtype="f8").wire is WireDtype.F8
    varying = {"agents": 8, "topology": "one-peer-exponential"}
    assert build(**varying).wire is WireDtype.F8
    assert build(byzantine="1:sign-flip").wire is WireDtype.F8
    with pytest.raises(ConfigError, match=r"time-varying.*--wire-dtype f8"):
        build(**varying, wire_dtype="u4")


def test_the_cnn_sizes_itself_from_square_images() -> None:
    need_torch()
    big = build(problem="cnn", params={"channels": [32, 64], "hidden": [384]})
    # conv 1->32 (320), conv 32->64 (18,496), 64*2*2 -> 384 (98,688), 384 -> 10 (3,850)
    assert big.config.dim == 121_354 and big.wire is WireDtype.U4
    assert build(problem="cnn").config.dim == 80 + 1_168 + 4_160 + 650
    with pytest.raises(ConfigError, match="13 features besides the bias, not a square"):
        build(problem="cnn", dataset="wine")
    assert build(problem="cnn", params={"channels": [2, 2, 2]}).config.dim > 0  # 8 -> 1
    with pytest.raises(ConfigError, match=r"4 convolutions halve the side 4 times.*8x8"):
        build(problem="cnn", params={"channels": [2, 2, 2, 2]})
    with pytest.raises(ConfigError, match="list one or more counts"):
        build(problem="cnn", params={"channels": []})


def test_the_cnn_gradient_is_the_modules() -> None:
    """Central differences of a float64 CNN's risk agree with its gradient."""
    need_torch()
    from privnet.torch import CNN

    problem = CNN(channels=(2, 3), hidden=(5,), dtype="float64")
    data = datasets.load("digits")
    x, y = data.x_train[:30], data.y_train[:30]
    risk = problem.risk(x, y, data.classes)
    gen = np.random.default_rng(4)
    w = gen.normal(scale=0.3, size=(2, problem.dim(x.shape[1], data.classes)))
    assert_gradient_is_the_difference(risk, w, gen)


def test_a_cnn_runs_the_same_on_the_oracle_and_the_memory_engine() -> None:
    """float32 on the u4 wire: the memory engine's models are the oracle's, and local-ghp's
    are none's to the lattice's rounding."""
    need_torch()
    exp = privnet.Experiment(
        agents=4, iters=4, problem="cnn", params={"channels": [4, 8], "hidden": [16]},
        dataset="digits", samples=30, batch=10, strategies="atc", schemes="none,local-ghp",
        seed=3, feature_noise=0.0,
    )  # fmt: skip
    oracle, memory = privnet.simulate(exp, "oracle"), privnet.simulate(exp, "memory")
    for scheme in ("none", "local-ghp"):
        session = f"atc/{scheme}/0"
        np.testing.assert_allclose(memory.models[session], oracle.models[session], atol=1e-9)
    gap = np.abs(memory.models["atc/none/0"] - memory.models["atc/local-ghp/0"]).max()
    assert 0 < gap < 1e-5
    assert all(r["wire_dtype"] == "u4" for r in memory.records)
