"""A memory-engine run under a test's control, shared by test_node and test_conductor.

`Harness` wraps a `router.Routed` network (conductor + nodes on the tests' stepping `Router`)
with a fake clock, a record of every frame delivered, one-shot hooks that fire when the
run reaches a state (so a frame can be delivered in an exact phase), frames held back and
released later, and builders for control frames signed by anyone, for any run.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Literal

import numpy as np
from probes import inject, uncounted
from router import Endpoint, Routed

from privnet.agent import control, keys, topics, wire
from privnet.agent.core import AgentCore
from privnet.agent.messages import Model, Rejected
from privnet.agent.node import AgentNode
from privnet.agent.protocol import Checkpoint, Output, Publish
from privnet.agent.spec import Scheme, Strategy
from privnet.orchestrator.conductor import Conductor, SessionResult, Stage, View
from privnet.orchestrator.engines.memory import CONDUCTOR
from privnet.orchestrator.experiment.config import ExperimentConfig
from privnet.orchestrator.experiment.instance import Instance
from privnet.orchestrator.experiment.specs import session_plans

RUN = "test-run"
# Seed 34 draws a sparse geometric graph on 10 agents (degrees 1 to 4, two leaves), as in
# test_memory: local-ghp's pairs and its single-neighbour fallback both occur.
AGENTS, ROUNDS, SEED = 10, 3, 34
RTOL = 1e-9  # relative to the largest model entry: the same scheme on two engines
# local-ghp against none: each weighted term is released on the noise grid (2^-20 of b), so
# the trajectories part by about that per round (8e-8 of the largest entry in 10 rounds)
LATTICE_RTOL = 1e-6
FRESH = 10**9  # sequence numbers above anything a run uses
CONTROL_TYPES = {t.__name__.lower() for t in (*control.Up.__args__, *control.Down.__args__)}
Session = tuple[Strategy, Scheme]
Party = AgentNode | Conductor


def model_place(frame: Publish) -> tuple[int, int] | None:
    """(view, round) of a model frame as anyone on the wire reads it, sealed (its clear
    head) or not; None for any other frame."""
    if frame.category != "model":
        return None
    try:
        fields = wire.read_head(frame.payload).fields
    except Rejected:  # a frame of the visible wire
        msg = wire.peek_peer(frame.payload, problem().config.dim)
        return (msg.view, msg.round) if isinstance(msg, Model) else None
    return fields["view"], fields["round"]


@functools.cache
def problem(rounds: int = ROUNDS) -> Instance:
    return Instance.build(ExperimentConfig(agents=AGENTS, iters=rounds, repeats=1, seed=SEED))


class Clock:
    """Time that moves only when a test moves it."""

    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


Predicate = Callable[[], bool]
Action = Callable[[], None]
Hold = Callable[[str, Publish], bool]


@dataclass
class Harness:
    net: Routed
    clock: Clock
    sent: list[tuple[str, Publish]] = field(default_factory=list)  # delivered, in order
    held: list[tuple[str, Publish]] = field(default_factory=list)
    hold: Hold | None = None  # frames it selects wait in `held` until `release`
    hooks: list[tuple[Predicate, Action]] = field(default_factory=list)
    fired: int = 0
    in_flight: Publish | None = None  # the frame about to be delivered, while hooks run
    decoded: list[tuple[Publish, control.Control]] = field(default_factory=list)  # control
    lose: Hold | None = None  # frames it selects are lost on the way
    lost: list[tuple[str, Publish]] = field(default_factory=list)
    stopped: dict[str, list[tuple[str, bytes]]] = field(default_factory=dict)  # and queued
    cut: set[str] = field(default_factory=set)  # crashed: whatever they send is lost
    retired: list[AgentNode] = field(default_factory=list)  # replaced by a restart
    _seq: itertools.count[int] = field(default_factory=lambda: itertools.count(FRESH))

    @classmethod
    def build(
        cls,
        sessions: Iterable[Session] = ((Strategy.ATC, Scheme.LOCAL_GHP),),
        *,
        rounds: int = ROUNDS,
        telemetry: bool = True,
        deadline: float = 30.0,
        core: Callable[..., AgentCore] = AgentCore,
        script: Iterable[View] | None = None,
        checkpoint_every: int = 0,
        seal_links: bool = True,
        escrow: bool = False,
    ) -> Harness:
        """`seal_links=False`: the visible wire, for tests that forge peer frames as only a
        link's two ends could seal them."""
        plans = session_plans(problem(rounds), [(s, sc, 0) for s, sc in sessions])
        net = Routed.build(
            plans,
            core=core,
            deadline=deadline,
            telemetry=telemetry,
            run=RUN,
            script=script,
            seal_links=seal_links,
            escrow=escrow,
        )
        net.conductor.checkpoint_every = checkpoint_every
        harness = cls(net, Clock())
        net.router.clock = harness.clock
        net.router.edit = harness._edit
        return harness

    # ---- the parties --------------------------------------------------------------------

    @property
    def conductor(self) -> Conductor:
        return self.net.conductor

    @property
    def nodes(self) -> list[AgentNode]:
        return self.net.nodes

    def parties(self) -> list[Party]:
        return [self.conductor, *self.nodes, *self.retired]

    # ---- running ------------------------------------------------------------------------

    def start(self) -> Harness:
        self.net.start()
        self.net.router.drain()
        return self

    def finish(self) -> list[SessionResult]:
        """Release what was held, play to the end and say Bye."""
        self.release()
        assert self.conductor.stage is Stage.DONE, self.conductor.failure
        self._hooks()  # the last chance to act while the conductor is done
        self.net.router.send(CONDUCTOR, self.conductor.bye())
        self.net.router.drain()
        return self.conductor.results

    def play(self) -> list[SessionResult]:
        return self.start().finish()

    def advance(self, seconds: float) -> None:
        """Move the fake clock `seconds` on, ticking every party that is not stopped (the
        conductor, the nodes) whenever it asks to be, and delivering what comes of it."""
        end, ticked = self.clock.now + seconds, None
        while True:
            parties = {
                name: party
                for name, party in self.named()
                if name not in self.stopped and not (isinstance(party, AgentNode) and party.done)
            }
            due = {name: party.next_tick() for name, party in parties.items()}
            now = self.clock.now
            ripe = [name for name, t in due.items() if t is not None and t <= now]
            if ripe and ticked != now:  # each party's tick once per instant
                ticked = now
                for name in ripe:
                    self.net.router.send(name, parties[name].tick(now))
                self.net.router.drain()
                continue
            later = [t for t in due.values() if t is not None and t > now]
            if not later or min(later) > end:
                break
            self.clock.now = min(later)
        self.clock.now = max(self.clock.now, end)

    def named(self) -> list[tuple[str, Party]]:
        return [(CONDUCTOR, self.conductor), *((f"agent-{n.me}", n) for n in self.nodes)]

    def stop(self, agent: int) -> None:
        """SIGSTOP: the agent neither ticks nor reads; what reaches it waits, in order (a
        broker keeping a connected client's queue), and what it had sent is on its way."""
        name = f"agent-{agent}"
        queue: list[tuple[str, bytes]] = []
        self.stopped[name] = queue
        self._swap(name, _Queue(queue))

    def resume(self, agent: int) -> None:
        """SIGCONT: what waited is delivered first, then time goes on for it too."""
        name = f"agent-{agent}"
        queue = self.stopped.pop(name)
        node = self.nodes[agent]
        self._swap(name, node)
        for topic, payload in queue:
            self.net.router.send(name, node.receive(topic, payload, self.clock()))
        self.net.router.drain()

    def crash(self, agent: int) -> None:
        """kill -9: the agent reads and sends nothing from now on (what it sent before is
        on its way); the conductor hears of it as the shell would (`lost`)."""
        name = f"agent-{agent}"
        self.stopped[name] = []
        self._swap(name, _Queue([]))
        self.cut.add(name)
        out = self.conductor.lost(agent, "crashed", self.clock())
        self.net.router.send(CONDUCTOR, out)

    def restart(self, agent: int, checkpoint: Checkpoint | None = None) -> AgentNode:
        """A crashed agent started again: a new process, a new identity, the same launch
        token, `rejoin` set (and its checkpoint, if any); it says Hello and Rejoins."""
        name = f"agent-{agent}"
        old = self.nodes[agent]
        launch = dataclasses.replace(old.launch, rejoin=True)
        node = AgentNode(launch, keys.Identity.generate(), checkpoint=checkpoint)
        self.retired.append(old)
        self.nodes[agent] = node
        self.stopped.pop(name, None)
        self.cut.discard(name)
        self._swap(name, node)
        self.net.router.send(name, node.start(self.clock()))
        self.net.router.drain()
        return node

    def _swap(self, name: str, new: Endpoint) -> None:
        """Whatever reached `name` now reaches `new`."""
        self.net.router.swap(name, new, self.nodes[int(name.split("-")[1])].subscriptions)

    def when(self, ready: Predicate, action: Action) -> None:
        """Run `action` once, before the first delivery at which `ready()` holds."""
        self.hooks.append((ready, action))

    def release(self) -> None:
        self.hold = None
        held, self.held = self.held, []
        for publisher, frame in held:
            inject(self.net.router, frame.topic, frame.payload, publisher)
        self.net.router.drain()

    def _hooks(self) -> None:
        for hook in list(self.hooks):
            ready, action = hook
            if ready():
                self.hooks.remove(hook)
                self.fired += 1
                action()

    def _edit(self, publisher: str, frame: Publish) -> Publish | None:
        self.in_flight = frame
        self._hooks()
        if publisher in self.cut or (self.lose is not None and self.lose(publisher, frame)):
            self.lost.append((publisher, frame))
            return None
        if self.hold is not None and self.hold(publisher, frame):
            self.held.append((publisher, frame))
            return None
        self.sent.append((publisher, frame))
        if frame.category in ("control", "telemetry"):
            self.decoded.append((frame, wire.decode_signed(frame.payload).msg))
        return frame

    def strike(
        self, party: Party, ready: Predicate, frame: Callable[[], tuple[str, bytes]], reason: str
    ) -> None:
        """Play a run in which `frame()` reaches `party` once, as soon as `ready()` holds:
        nothing comes out, the party's phase stays, `reason` is counted once, and that is
        the only rejection anywhere; the models are a clean run's."""

        def hit() -> None:
            phase, before = _phase(party), Counter(party.deliveries.rejected)
            assert self.deliver(party, *frame()) == Output()
            assert _phase(party) is phase
            assert party.deliveries.rejected - before == Counter({reason: 1})

        self.when(ready, hit)
        results = self.play()
        assert self.fired == 1
        assert self.rejected() == Counter({reason: 1})
        self.assert_all_counted()
        assert_same_models(results, clean())

    def deliver(self, party: Party, topic: str, payload: bytes) -> Output:
        """Straight to `party`, bypassing the router (the exact phase a hook found)."""
        return party.receive(topic, payload, self.clock())

    # ---- frames -------------------------------------------------------------------------

    def down(
        self,
        msg: control.Control,
        to: int | Literal["all"] = "all",
        *,
        seq: int | None = None,
        run: str = RUN,
        signer: keys.Identity | None = None,
    ) -> tuple[str, bytes]:
        """A downward frame, signed by the orchestrator unless `signer` says otherwise."""
        signer = signer or self.conductor.identity
        seq = next(self._seq) if seq is None else seq
        return topics.ctl_down(RUN, to), wire.encode_signed(msg, run, seq, signer)

    def beat(self) -> tuple[str, bytes]:
        """A genuine Beat, next in the conductor's own sequence (so its later frames stay
        fresh), for a node that should hear from a live orchestrator."""
        frame = self.conductor.down("all", control.Beat())
        return frame.topic, frame.payload

    def up(
        self,
        msg: control.Control,
        agent: int,
        *,
        seq: int | None = None,
        run: str = RUN,
        signer: keys.Identity | None = None,
        topic: str | None = None,
    ) -> tuple[str, bytes]:
        """An upward frame on agent `agent`'s topic, signed by its identity unless told."""
        signer = signer or self.nodes[agent].identity
        seq = next(self._seq) if seq is None else seq
        upward = (control.Telemetry, control.Escrow)
        kind = topics.telemetry if isinstance(msg, upward) else topics.ctl_up
        topic = topic or kind(RUN, agent)
        return topic, wire.encode_signed(msg, run, seq, signer)

    def read(self, frame: Publish) -> wire.Peer:
        """The peer message in `frame`, opened as its sender can (sealed or not)."""
        peer = topics.parse_peer_topic(frame.topic)
        assert peer is not None, f"{frame.topic} is no peer topic"
        session = self.nodes[peer[2]].session
        assert session is not None, f"agent {peer[2]} has no session to read {frame.topic}"
        return session.links.read(frame.payload)

    def recorded(self, kind: type, topic: str | None = None) -> list[Publish]:
        """Control frames of type `kind` delivered so far (on `topic`, if given)."""
        return [
            frame
            for frame, msg in self.decoded
            if isinstance(msg, kind) and (topic is None or frame.topic == topic)
        ]

    def peer_frames(self) -> list[Publish]:
        return [frame for _, frame in self.sent if frame.category in ("model", "keys")]

    # ---- what came out ------------------------------------------------------------------

    def rejected(self) -> Counter[str]:
        """Every party's rejections, summed."""
        total: Counter[str] = Counter()
        for party in self.parties():
            total += party.deliveries.rejected
        return total

    def assert_all_counted(self) -> None:
        for party in self.parties():
            assert uncounted(party.deliveries) == 0, (party, party.deliveries)


@dataclass
class _Queue:
    """What a stopped agent's subscriptions lead to: frames wait for `Harness.resume`."""

    frames: list[tuple[str, bytes]]

    def receive(self, topic: str, payload: bytes, now: float) -> Output:
        self.frames.append((topic, payload))
        return Output()

    def unsubscribed(self, topic: str, now: float) -> Output:
        raise AssertionError(f"a stopped agent unsubscribed from {topic!r}")


def _phase(party: Party) -> object:
    return party.stage if isinstance(party, Conductor) else party.phase


def assert_same_models(
    got: list[SessionResult], want: list[SessionResult], rtol: float = RTOL
) -> None:
    """Session by session, every agent's model after every round, to `rtol` of the largest."""
    assert len(got) == len(want)
    for mine, theirs in zip(got, want, strict=True):
        assert mine.models.shape == theirs.models.shape
        assert not np.isnan(mine.models).any()
        gap = np.max(np.abs(mine.models - theirs.models))
        assert gap <= rtol * np.max(np.abs(theirs.models)), (mine.label, gap)


def assert_whole_rounds(models: np.ndarray, membership: list[View]) -> None:
    """Every round of a session's `models` (rounds x P x M) that stands has the report of
    every member of the view it stands in (`membership`: the session's views, in order)."""
    ends = [v.start - 1 for v in membership[1:]] + [models.shape[0]]
    for view, end in zip(membership, ends, strict=True):
        got = ~np.isnan(models[view.start - 1 : end, list(view.members), 0])
        assert got.all(), (view, np.argwhere(~got) + np.array([view.start, 0]))


@functools.cache
def _clean(sessions: tuple[Session, ...]) -> list[SessionResult]:
    return Harness.build(sessions).play()


def clean(sessions: Iterable[Session] = ((Strategy.ATC, Scheme.LOCAL_GHP),)) -> list[SessionResult]:
    """The results of an untouched run of `sessions` (fresh keys, same seed)."""
    return _clean(tuple(sessions))
