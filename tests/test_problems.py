"""Problems as plug-ins: one written outside privnet, registered by an entry point of a
distribution on the path, runs on all three engines exactly as the built-in it imitates;
sealed into each Setup by name and parameters; and what an agent cannot build, it says."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from conftest import need_mosquitto

import privnet
from privnet.agent import plugins, wire
from privnet.agent.control import Config
from privnet.agent.losses import make_loss
from privnet.agent.problems import make
from privnet.agent.spec import ConfigError, Scheme, Strategy
from privnet.orchestrator.experiment.instance import Instance
from privnet.orchestrator.experiment.specs import agent_specs

# A least-squares problem written from the formula, not from privnet's: per-agent loops in
# the oracle (it does not declare `stacks`), its own gradient and closed-form optimum.
OUTSIDE = '''
import numpy as np


class SquaredError:
    """J_p(w) = 1/N ||y - X w||^2 + rho ||w||^2."""

    def __init__(self, rho: float = 0.0) -> None:
        self.rho = rho

    def dim(self, features: int, classes: int) -> int:
        return features

    def risk(self, x, y, classes):
        return _Risk(x, y, self.rho)

    def optimum(self, parts):
        m = parts[0][0].shape[1]
        h = sum(x.T @ x / len(y) for x, y in parts) / len(parts) + self.rho * np.eye(m)
        b = sum(x.T @ y / len(y) for x, y in parts) / len(parts)
        return np.linalg.solve(h, b)


class _Risk:
    def __init__(self, x, y, rho):
        self.x, self.y, self.rho = x, y, rho

    def gradient(self, w, rows):
        x, y = (self.x, self.y) if rows is None else (self.x[rows], self.y[rows])
        return 2.0 * ((x @ w.T - y[:, None]).T @ x / len(y) + self.rho * w)
'''
NAME = "squared-error"  # its entry point in privnet.problems
SMALL = dict(agents=6, iters=40, samples=50, batch=20, strategies="atc,consensus", seed=4)
SCHEMES = "none,ghp,local-ghp"
EQUAL = 1e-12  # |outside - built-in| of every model coordinate, every round


@pytest.fixture(scope="module")
def registered(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A distribution `outside-problems` on sys.path (and on the agents' PYTHONPATH) whose
    entry point `squared-error` in the group privnet.problems is its SquaredError."""
    root = tmp_path_factory.mktemp("site")
    (root / "outside_problems.py").write_text(OUTSIDE)
    info = root / "outside_problems-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: outside-problems\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(
        f"[privnet.problems]\n{NAME} = outside_problems:SquaredError\n"
    )
    with pytest.MonkeyPatch.context() as patch:
        patch.syspath_prepend(str(root))
        old = [p for p in (os.environ.get("PYTHONPATH"),) if p]
        patch.setenv("PYTHONPATH", os.pathsep.join([str(root), *old]))
        yield root


def both(engine: str, out: Path) -> tuple[privnet.Result, privnet.Result]:
    """The built-in least squares and the outside one, same experiment, on one engine."""
    runs = []
    for problem in ("least-squares", NAME):
        exp = privnet.Experiment(**SMALL, schemes=SCHEMES, problem=problem, dataset="linear")
        if engine == "net":
            exp = dataclasses.replace(exp, broker="mosquitto", out=str(out / problem))
            runs.append(privnet.run(exp))
        else:
            runs.append(privnet.simulate(exp, engine))
    return runs[0], runs[1]


@pytest.mark.parametrize("engine", ["oracle", "memory", "net"])
def test_an_outside_problem_by_entry_point_equals_the_built_in(
    registered: Path, engine: str, tmp_path: Path
) -> None:
    assert plugins.entry_points("problem")[NAME] == "outside_problems:SquaredError"
    if engine == "net":
        need_mosquitto()
    built_in, outside = both(engine, tmp_path)
    assert (
        set(built_in.models)
        == set(outside.models)
        == {f"{st}/{sc}/0" for st in ("atc", "consensus") for sc in SCHEMES.split(",")}
    )
    for session, models in built_in.models.items():
        assert models.shape == (SMALL["iters"], SMALL["agents"], 2)
        np.testing.assert_allclose(outside.models[session], models, rtol=0, atol=EQUAL)
    for ours, theirs in zip(built_in.curves, outside.curves, strict=True):
        np.testing.assert_allclose(theirs.msd_centroid, ours.msd_centroid, rtol=1e-9)
    if engine == "net":  # the Setup named the problem; the agents imported it themselves
        log = (tmp_path / NAME / "logs" / "agent-0.log").read_text()
        assert "Traceback" not in log


def test_the_setup_carries_the_problem_by_name_and_parameters(registered: Path) -> None:
    exp = privnet.Experiment(**SMALL, schemes="none", problem=NAME, dataset="linear", rho=0.25)
    problem = Instance.build(exp.config)
    share = problem.specs(0)[3]
    assert (share.problem, share.params) == (NAME, (("rho", 0.25),))
    spec = agent_specs(problem, Strategy.ATC, Scheme.NONE)[3]
    sealed = wire.encode_config(Config(spec, share, {}, deadline=1.0, telemetry=True))
    assert b"outside_problems" not in sealed and b"SquaredError" not in sealed  # a name, no code
    back = wire.decode_config(sealed).problem
    assert back == share
    assert type(make(back.problem, back.params)).__module__ == "outside_problems"
    np.testing.assert_array_equal(
        make_loss(back).grad(np.ones(2), 1), make_loss(share).grad(np.ones(2), 1)
    )


def test_module_colon_class_in_the_config_runs_too(registered: Path) -> None:
    exp = privnet.Experiment(
        **SMALL, schemes="none", problem="outside_problems:SquaredError", dataset="linear"
    )
    ours = privnet.simulate(dataclasses.replace(exp, problem="least-squares"), "memory")
    theirs = privnet.simulate(exp, "memory")
    np.testing.assert_allclose(theirs.models["atc/none/0"], ours.models["atc/none/0"], atol=EQUAL)


def test_what_cannot_be_a_problem_is_refused_clearly(tmp_path: Path) -> None:
    for problem, words in (
        ("no-such-problem", "unknown problem 'no-such-problem'; known: cnn, least-squares"),
        ("os:system;rm", "is not a plug-in name"),
        ("no_such_module:Thing", "cannot import 'no_such_module'"),
        ("json:nothing", "module 'json' has no 'nothing'"),
        ("json:loads", r"must be a class with dim\(\) and risk\(\)"),
    ):
        with pytest.raises(ConfigError, match=words):
            Instance.build(privnet.Experiment(**SMALL, problem=problem))
    with pytest.raises(ConfigError, match="parameters are numbers, strings, booleans"):
        privnet.Experiment(**SMALL, params={"layer": object()})
    with pytest.raises(ConfigError, match="unexpected keyword argument 'width'"):
        Instance.build(privnet.Experiment(**SMALL, params={"width": 3}))


def test_an_agent_that_cannot_build_its_problem_fails_saying_why() -> None:
    """The orchestrator could build it, this agent cannot (not installed here): the node
    fails with the reason, and the conductor hears it and leaves the agent out of the view
    with that reason (no silent stall); the others finish the session."""
    from privnet.orchestrator.engines.memory import Network
    from privnet.orchestrator.experiment.specs import session_list, session_plans

    problem = Instance.build(
        privnet.Experiment(**{**SMALL, "strategies": "atc"}, schemes="none").config
    )
    plans = session_plans(problem, session_list(problem.config))
    gone = dataclasses.replace(plans[0].problems[2], problem="gone_module:Gone")
    plans[0] = dataclasses.replace(
        plans[0], problems=(*plans[0].problems[:2], gone, *plans[0].problems[3:])
    )
    network = Network.build(plans)
    result = network.play()[0]
    why = "agent 2: problem 'gone_module:Gone': cannot import 'gone_module'"
    assert network.nodes[2].failure.startswith(why)
    assert why in result.views[-1].left[2] and 2 not in result.views[-1].members
    assert result.missed == {2: SMALL["iters"]}


def test_a_model_over_the_most_chunks_is_refused_naming_the_limit() -> None:
    """One peer frame no longer bounds a model (over it, it goes in chunks); the chunk
    count does, and the refusal names it."""
    one_frame = wire.max_model_dim()
    assert wire.model_frame_bytes(one_frame) <= wire.MAX_PEER_BYTES
    assert not wire.needs_chunks(one_frame) and wire.needs_chunks(one_frame + 1)
    Instance.build(privnet.Experiment(agents=3, iters=2, dim=one_frame + 1, seed=1))
    limit = wire.max_chunked_dim()
    assert wire.chunk_count(limit) == wire.MAX_CHUNKS < wire.chunk_count(limit + 1)
    wide = {"hidden": [460_000]}  # digits: 65 x 460,000 + 460,000 + 460,000 x 10 + 10
    mlp = {"agents": 3, "iters": 2, "problem": "mlp", "dataset": "digits", "params": wide}
    with pytest.raises(ConfigError, match=f"at most {wire.MAX_CHUNKS:,} chunks") as caught:
        Instance.build(privnet.Experiment(**mlp, wire_dtype="f8"))  # float32 mlp: u4 by default
    assert "privnet.agent.wire.chunks.MAX_CHUNKS" in str(caught.value)
    assert f"{limit:,} float64" in str(caught.value) and "34,960,010 parameters" in str(
        caught.value
    )
