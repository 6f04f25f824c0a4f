"""Each agent holds its own secrets only (issue 24, item 2; issue 18, item 4).

The orchestrator derives every agent's data, minibatch and noise keys one way from the
run's master seed (privnet/orchestrator/experiment/seeds.py) and seals to each agent only its own.
An insider holding one agent's launch and everything that agent received, its opened
Setups included, learns no value that regenerates another agent's data or noise: fed any
number it holds as the seed, with the public defaults, the memory engine rebuilds no other
agent's models.
"""

from __future__ import annotations

import dataclasses
import secrets
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.kdf.hkdf import HKDF
from probes import matches

from privnet.agent import control, keys, rng, topics, wire
from privnet.agent.node import Launch
from privnet.agent.problems import Linear
from privnet.agent.protocol import Publish, setup_context
from privnet.agent.spec import Scheme, Strategy
from privnet.orchestrator.conductor import View
from privnet.orchestrator.engines.memory import Network
from privnet.orchestrator.experiment import seeds
from privnet.orchestrator.experiment.config import ExperimentConfig
from privnet.orchestrator.experiment.instance import Instance
from privnet.orchestrator.experiment.specs import agent_specs, session_list, session_plans

INSIDER = 3
AGENTS, ITERS = 4, 5
LEAVER, LEFT = 1, 3  # agent 1 is out of the network from round 3 (a second view)
SESSIONS = (Scheme.RANDOM, Scheme.GHP)
OTHERS = [m for m in range(AGENTS) if m != INSIDER]
APART = 0.05  # relative model distance that no float noise reaches (masks cancel to 1e-15)


def public_config(seed: int, schemes: tuple[Scheme, ...] = SESSIONS) -> ExperimentConfig:
    """The run: public defaults but for the size, the schemes and the seed (on a complete
    graph, so the insider hears every agent and its directory names them all)."""
    return ExperimentConfig(
        agents=AGENTS,
        iters=ITERS,
        strategies=(Strategy.ATC,),
        schemes=schemes,
        topology="complete",
        seed=seed,
    )


def random_models(seed: int, script: list[View]) -> np.ndarray:
    """The models (iters, P, M) of the run's first session (random) on the memory engine."""
    problem = Instance.build(public_config(seed, (Scheme.RANDOM,)))
    plans = session_plans(problem, session_list(problem.config))
    return Network.build(plans, script=script).play()[0].models


def ints_in(value: Any) -> Iterator[int]:
    """Every integer inside a Config (or launch), as an insider would try them: each
    field, and each pair of 64-bit words and each byte string read as one number."""
    if isinstance(value, bool):
        return
    if isinstance(value, int):
        yield value
    elif isinstance(value, bytes):
        yield int.from_bytes(value, "big")
        yield int.from_bytes(value, "little")
    elif isinstance(value, float):
        if value.is_integer():
            yield int(value)
    elif dataclasses.is_dataclass(value):
        for f in dataclasses.fields(value):
            yield from ints_in(getattr(value, f.name))
    elif isinstance(value, dict):
        for k, v in value.items():
            yield from ints_in(k)
            yield from ints_in(v)
    elif isinstance(value, (tuple, list)):
        if len(value) == 2 and all(type(v) is int for v in value):
            yield (value[0] << 64) | value[1]
        for v in value:
            yield from ints_in(v)


@dataclasses.dataclass
class Insider:
    """Everything one agent held in a run: its launch, the control messages delivered to
    it, the Configs its Setups opened to (every session and view), and every byte it
    received (peer frames included)."""

    seed: int
    script: list[View]
    launch: Launch
    messages: list[control.Control]
    configs: list[control.Config]
    received: bytes

    def numbers(self) -> set[int]:
        return {n for held in (self.launch, self.messages, self.configs) for n in ints_in(held)}


def held_by(agent: int, seed: int, script: list[View]) -> Insider:
    """A run of `seed` as agent `agent` lived it."""
    problem = Instance.build(public_config(seed))
    plans = session_plans(problem, session_list(problem.config))
    frames: list[Publish] = []
    net = Network.build(plans, tap=lambda _who, frame: frames.append(frame), script=script)
    node = net.nodes[agent]
    net.play()
    mine = [f for f in frames if any(matches(p, f.topic) for p in node.subscriptions)]
    control_topics = (topics.ctl_down(node.run, agent), topics.ctl_down(node.run, "all"))
    messages = [wire.decode_signed(f.payload).msg for f in mine if f.topic in control_topics]
    configs = []
    for setup in messages:
        if isinstance(setup, control.Setup) and setup.agent == agent:
            context = setup_context(node.run, agent, setup.session, setup.view)
            plain = keys.open_sealed(node.identity.static, setup.sealed, context)
            configs.append(wire.decode_config(plain))
    received = b"".join([node.launch.token, *(f.payload for f in mine)])
    return Insider(seed, script, node.launch, messages, configs, received)


@pytest.fixture(scope="module")
def insider() -> Insider:
    seed = secrets.randbits(63)  # as `privnet run` draws it
    # A membership change mid-session, so the insider also opens a later view's Setup.
    script = [
        View(0, 0, 1, tuple(range(AGENTS)), "start"),
        View(0, 1, LEFT, tuple(m for m in range(AGENTS) if m != LEAVER), "lost", {}, {LEAVER: "x"}),
    ]
    return held_by(INSIDER, seed, script)


def test_the_insider_opened_every_session_and_view(insider: Insider) -> None:
    assert {(c.spec.view, c.spec.scheme) for c in insider.configs} == {
        (0, Scheme.RANDOM),
        (1, Scheme.RANDOM),
        (0, Scheme.GHP),
    }


def test_nothing_an_agent_holds_rebuilds_another_agents_models(insider: Insider) -> None:
    """Every number agent 3 holds, fed to the memory engine as the seed with the public
    defaults, gives every other agent models far from its real ones. (On the old wire,
    the Setup carried the seed itself, and this rebuilt all of them exactly.)"""
    real = random_models(insider.seed, insider.script)[:, OTHERS]
    have = ~np.isnan(real[..., 0])  # not the leaver's rounds out of the network
    scale = np.median(np.abs(real[have]))
    guesses = sorted(n for n in insider.numbers() if n >= 0)  # seeds are >= 0
    assert len(guesses) >= 30  # ids, rounds, its keys, session ids, the directory, its token
    for guess in guesses:
        got = random_models(guess, insider.script)[:, OTHERS]
        assert np.median(np.abs(got - real)[have]) > APART * scale, guess


def test_no_setup_holds_the_seed_or_another_agents_keys(insider: Insider) -> None:
    """Neither the seed (as a number, its decimal text, its 8 bytes either way) nor any key
    of another agent, for any purpose, is anywhere in what agent 3 received."""
    seed, configs = insider.seed, insider.configs
    plain = b"".join(wire.encode_config(c) for c in configs)
    for blob in (plain, insider.received):
        for form in (b"%d" % seed, seed.to_bytes(8, "big"), seed.to_bytes(8, "little")):
            assert form not in blob
    numbers = insider.numbers()
    assert seed not in numbers
    theirs = {
        k
        for purpose in seeds.Purpose
        for repeat in (0, 1)
        for m, key in enumerate(seeds.keys(seed, purpose, repeat, AGENTS))
        if m != INSIDER
        for k in key
    }
    assert not numbers & theirs
    own = {p: seeds.key(seed, p, 0, INSIDER) for p in seeds.Purpose}
    for config in configs:  # and the keys it holds are its own
        problem = config.problem
        assert isinstance(problem.data, Linear)
        assert config.spec.noise_key == own[seeds.Purpose.NOISE]
        assert problem.data_key == own[seeds.Purpose.DATA]
        assert problem.batch_key == own[seeds.Purpose.BATCH]


def test_no_agent_can_draw_another_agents_noise() -> None:
    """Agent m's spec gives it its own random/ghp stream only: every other agent's key
    differs, and no draw m can make at a round equals what k drew there."""
    problem = Instance.build(public_config(secrets.randbits(63)))
    specs = agent_specs(problem, Strategy.ATC, Scheme.RANDOM)
    data = problem.specs(0)
    for field in ("data_key", "batch_key"):
        assert len({getattr(s, field) for s in data}) == AGENTS
    assert len({s.noise_key for s in specs}) == AGENTS
    width = AGENTS * problem.config.dim
    for round_ in (1, 2):
        drawn = [rng.raw_row(s.noise_key, rng.Domain.NOISE, 2, round_, width) for s in specs]
        for m in range(AGENTS):
            for k in range(AGENTS):
                if k != m:
                    assert not np.isin(drawn[k], drawn[m]).any()


def test_the_twin_changes_one_agents_data_key_only() -> None:
    problem = Instance.build(public_config(11))
    specs, twin = problem.specs(0), problem.twin(2).specs(0)
    assert [s == t for s, t in zip(specs, twin, strict=True)] == [m != 2 for m in range(AGENTS)]
    assert twin[2].data_key == seeds.key(11, seeds.Purpose.TWIN_DATA, 0, 2)
    assert twin[2].batch_key == specs[2].batch_key  # same minibatch draws on D and D'


def test_keys_are_rfc5869_hkdf_sha256() -> None:
    info = b"noise\0" + (3).to_bytes(8, "big") + (5).to_bytes(4, "big")
    okm = HKDF(hashes.SHA256(), 16, seeds.SALT, info).derive(b"123456789")
    want = (int.from_bytes(okm[:8], "big"), int.from_bytes(okm[8:], "big"))
    assert seeds.key(123456789, seeds.Purpose.NOISE, 3, 5) == want
    assert seeds.keys(123456789, seeds.Purpose.NOISE, 3, 6)[5] == want
    assert seeds.key(123456789, seeds.Purpose.PROBLEM, 3) != seeds.key(
        123456789, seeds.Purpose.PROBLEM, 3, 0
    )
