"""The reconstruction attack on the wire of memory-engine runs (the same messages a
recorded `privnet run --audit` holds): none is recovered to float precision; noise keeps
random and ghp out; local-ghp falls exactly where its hub sums pin the models down (to the
lattice it releases on), masked-ghp does not. Adversary by adversary: sealed outsiders read
nothing, insiders what is addressed to them, with the masks they hold."""

from __future__ import annotations

import dataclasses

import networkx as nx
import numpy as np
import pytest

from privnet.agent import rng
from privnet.agent.protocol import Publish
from privnet.agent.spec import Scheme, Strategy
from privnet.orchestrator import audit
from privnet.orchestrator.attack import RECOVERED, attack_session, insider_knowledge, reconstruct
from privnet.orchestrator.engines.memory import Network
from privnet.orchestrator.experiment import topology
from privnet.orchestrator.experiment.config import ExperimentConfig
from privnet.orchestrator.experiment.instance import Instance
from privnet.orchestrator.experiment.specs import session_plans
from privnet.orchestrator.privacy.accountant import Adversary
from privnet.orchestrator.replay import replay


def wire_of(problem: Instance, scheme: Scheme):
    run = replay(problem, Strategy.ATC, scheme, 0)
    return run.wire.models, run.clear


@pytest.fixture(scope="module")
def geometric() -> Instance:
    return Instance.build(ExperimentConfig(agents=10, iters=40, strategies=(Strategy.ATC,)))


def test_none_is_recovered_to_float_precision(geometric: Instance) -> None:
    seen, clear = wire_of(geometric, Scheme.NONE)
    record = attack_session(geometric, Strategy.ATC, Scheme.NONE, 0, seen, clear)
    assert record["broken"] and record["trajectory_rel_error_max"] < 1e-12
    assert max(record["minimizer_rel_error"]) < 1e-8  # quadratic losses: an exact affine fit


@pytest.mark.parametrize("scheme", [Scheme.RANDOM, Scheme.GHP, Scheme.LOCAL_GHP, Scheme.MASKED_GHP])
def test_noise_keeps_the_private_schemes_out(geometric: Instance, scheme: Scheme) -> None:
    seen, clear = wire_of(geometric, scheme)
    record = attack_session(geometric, Strategy.ATC, scheme, 0, seen, clear)
    assert not record["broken"] and record["agents_recovered"] == 0
    assert record["trajectory_rel_error_median"] > 1e-3


def test_local_ghp_estimates_obey_every_hub_sum(geometric: Instance) -> None:
    seen, clear = wire_of(geometric, Scheme.LOCAL_GHP)
    estimate = reconstruct(geometric, Strategy.ATC, Scheme.LOCAL_GHP, seen)
    a = geometric.A
    grid = rng.grid(geometric.config.sigma_g)
    for hub in range(10):
        others = [m for m in range(10) if m != hub and a[m, hub] > 0]
        if len(others) < 2:
            continue
        for i in (1, 20, 40):  # the hub's sum, each term on the lattice, as the hub adds it
            true = sum(rng.on_lattice(clear[(m, i, 2)], a[m, hub], grid) for m in others)
            guess = sum(a[m, hub] * estimate[(m, i, 2)] for m in others)
            np.testing.assert_allclose(guess, true, rtol=0, atol=len(others) * grid)


def test_local_ghp_falls_on_a_complete_graph() -> None:
    """Every hub sum is exact and the P x P system has full rank: all models come out."""
    problem = Instance.build(
        ExperimentConfig(agents=5, iters=10, topology="complete", strategies=(Strategy.ATC,))
    )
    seen, clear = wire_of(problem, Scheme.LOCAL_GHP)
    record = attack_session(problem, Strategy.ATC, Scheme.LOCAL_GHP, 0, seen, clear)
    assert record["pinned_directions"] == 5
    assert record["broken"] and record["trajectory_rel_error_max"] < RECOVERED  # the lattice
    assert record["verdict"] == "broken"
    masked_seen, masked_clear = wire_of(problem, Scheme.MASKED_GHP)
    masked = attack_session(problem, Strategy.ATC, Scheme.MASKED_GHP, 0, masked_seen, masked_clear)
    assert masked["pinned_directions"] == 5  # the same sums, exact: of ghp's releases
    assert masked["agents_recovered"] == 0 and masked["trajectory_rel_error_median"] > 1e-3


# ---- adversary by adversary -----------------------------------------------------------------


def test_sealed_outsiders_read_nothing_and_insiders_what_reaches_them(geometric: Instance) -> None:
    """A sealed wire read without a key yields no frame; an insider reads its own."""
    records: list[audit.WireRecord] = []

    def tap(_publisher: str, frame: Publish) -> None:
        records.append(audit.WireRecord(0.0, frame.topic, frame.payload))

    plans = session_plans(geometric, [(Strategy.ATC, Scheme.NONE, 0)])
    Network.build(plans, tap=tap, run="sealed").play()
    (keyless,) = audit.split_sessions(records, "sealed", geometric.config.dim)
    assert keyless.sealed > 0 and not keyless.models
    seen, clear = wire_of(geometric, Scheme.NONE)
    a = geometric.A
    hub = int(np.argmax((a > 0).sum(axis=0)))
    for adversary in (
        Adversary("wire", sealed=True),
        Adversary("link", sender=0, receiver=hub, sealed=True),
    ):
        record = attack_session(
            geometric, Strategy.ATC, Scheme.NONE, 0, keyless.models, clear, adversary
        )
        assert record["frames_read"] == 0 and record["agents_recovered"] == 0
        assert record["trajectory_rel_error_median"] == 1.0  # nothing read: the estimate 0
    insider = Adversary("hub", frozenset({hub}))
    record = attack_session(geometric, Strategy.ATC, Scheme.NONE, 0, seen, clear, insider)
    senders = [m for m in range(10) if m != hub and a[m, hub] > 0]
    assert record["frames_read"] == len(senders) * geometric.config.iters
    assert record["agents_recovered"] == len(senders)  # none: what reaches it is clear
    assert record["agents"] == 9 and record["trajectory_rel_error"][hub] is None


def path_problem() -> Instance:
    """1 - 0 - 2: hub 0 pairs its two neighbours; hubs 1 and 2 pair with 0 themselves."""
    graph = nx.path_graph([1, 0, 2])
    config = ExperimentConfig(agents=3, iters=10, strategies=(Strategy.ATC,))
    a = topology.combination_matrix(graph, "metropolis")
    return dataclasses.replace(Instance.build(config), graph=graph, A=a, q=topology.perron(a))


@pytest.mark.parametrize("scheme", [Scheme.LOCAL_GHP, Scheme.MASKED_GHP])
def test_a_coalition_holding_a_pair_mask_unmasks_the_partner(scheme: Scheme) -> None:
    """Hub 0 and agent 1 hold the only mask on agent 2's frames to 0: they read 2's release,
    its model under local-ghp, its ghp release (model plus its own draw) under masked-ghp."""
    problem = path_problem()
    run = replay(problem, Strategy.ATC, scheme, 0)
    released = {slot[1:]: v for slot, v in run.released.items()}
    coalition = Adversary("coalition", frozenset({0, 1}))
    known = insider_knowledge(problem, Strategy.ATC, scheme, coalition, released)
    assert {(m, k) for m, k, *_ in known} == {(0, 1), (1, 0), (2, 0)}  # its own, and 2's
    record = attack_session(
        problem, Strategy.ATC, scheme, 0, run.wire.models, run.clear, coalition, known, 2
    )
    if scheme is Scheme.LOCAL_GHP:
        assert record["agents_recovered"] == 1
        assert record["attacked_trajectory_rel_error"] < RECOVERED
    else:
        assert record["agents_recovered"] == 0 and record["attacked_trajectory_rel_error"] > 1e-3
    alone = Adversary("hub", frozenset({0}))  # the hub alone holds none of 2's masks at 0
    known = insider_knowledge(problem, Strategy.ATC, scheme, alone, released)
    assert not known
    record = attack_session(
        problem, Strategy.ATC, scheme, 0, run.wire.models, run.clear, alone, known, 2
    )
    assert record["agents_recovered"] == 0
