"""The audit's ground truth: a session replayed on the memory engine by witnesses, agent
cores that note the clear value behind every model they send, and the peer frames of a
session as an eavesdropper decodes them. The accountant's twin runs are two such replays
(on D and on D'); the audit holds a recorded wire against one.
"""

from __future__ import annotations

import contextlib
from collections import Counter, deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Any

import numpy as np

from privnet.agent import topics, wire
from privnet.agent.core import AgentCore
from privnet.agent.losses import Loss
from privnet.agent.messages import ORCHESTRATOR, KeyPlan, KeyShare, Message, Reason, Rejected
from privnet.agent.protocol import Publish
from privnet.agent.spec import AgentSpec, Scheme, StepPlan, Strategy
from privnet.orchestrator.conductor import View
from privnet.orchestrator.engines.memory import Network
from privnet.orchestrator.experiment.instance import Instance
from privnet.orchestrator.experiment.specs import session_plans


class AuditError(Exception):
    """The audit cannot proceed; the message says what is missing and how to get it."""


class _Witness(AgentCore):
    """An AgentCore that notes the clear value behind every model it is about to send
    (in `clear` by (sender, round, step), and in `views` by (view, sender, round, step)),
    and the scheme's release to each target before any mask (in `released` by (view,
    sender, receiver, round, step));
    given `losses`, agent p runs losses[p] instead of the one its Config describes; given
    `cores`, it leaves itself there under (view, agent), so a replay can run it on; given
    `pick`, it notes those coordinates only (a big model's audit sample)."""

    def __init__(
        self,
        spec: AgentSpec,
        loss: Loss,
        *args: Any,
        clear: dict[tuple[int, int, int], np.ndarray],
        losses: Sequence[Loss] | None = None,
        views: dict[tuple[int, int, int, int], np.ndarray] | None = None,
        released: dict[tuple[int, int, int, int, int], np.ndarray] | None = None,
        cores: dict[tuple[int, int], _Witness] | None = None,
        pick: np.ndarray | None = None,
    ) -> None:
        super().__init__(spec, loss if losses is None else losses[spec.agent], *args)
        self.clear, self.views, self.released, self.pick = clear, views, released, pick
        if cores is not None:
            cores[(spec.view, spec.agent)] = self

    def _send(self, plan: StepPlan) -> list[Message]:
        value = self.value.copy() if self.pick is None else self.value[self.pick]
        self.clear[(self.me, self.round, plan.step)] = value
        if self.views is not None:
            self.views[(self.spec.view, self.me, self.round, plan.step)] = value
        return super()._send(plan)

    def _release(self, plan: StepPlan) -> dict[int, np.ndarray]:
        out = super()._release(plan)
        if self.released is not None:
            for k, vector in out.items():
                noted = vector if self.pick is None else vector[self.pick]
                self.released[(self.spec.view, self.me, k, self.round, plan.step)] = noted
        return out


@dataclass
class Replay:
    """A memory-engine run: clear values (sender, round, step), the true models and the
    model messages on its wire, as an eavesdropper decodes them; `views` holds the clear
    values by (view, sender, round, step), those of rounds a later view redid included
    (`clear` keeps the ones that stand), and `released` the scheme's release to each target
    before any mask by (view, sender, receiver, round, step)."""

    clear: dict[tuple[int, int, int], np.ndarray]
    models: np.ndarray  # (iters, P, M)
    wire: SessionWire
    views: dict[tuple[int, int, int, int], np.ndarray] = field(default_factory=dict)
    released: dict[tuple[int, int, int, int, int], np.ndarray] = field(default_factory=dict)


def replay(
    problem: Instance,
    strategy: Strategy,
    scheme: Scheme,
    repeat: int = 0,
    *,
    losses: Sequence[Loss] | None = None,
    noise_keys: Sequence[tuple[int, int]] | None = None,
    views: Sequence[View] | None = None,
    reach: Mapping[int, int] | None = None,
    pick: np.ndarray | None = None,
) -> Replay:
    """The session on the memory engine (the whole protocol), witnesses for cores;
    `losses` (one per agent) replace the problem's, e.g. losses written by hand, and
    `noise_keys` (one per agent) the run's (same data, fresh noise: the dp-audit's trials).

    `views`: the membership views the run played the session under (membership.json),
    applied at their rounds as the conductor's script. A view that a later one replaced
    may have run further on the network than the script lets it (the rounds it began
    before its members stopped, which the next view redid): `reach` (view -> last round
    of it on the wire) says how far, and its witnesses are run on to there, so every
    frame of it has its clear value in `Replay.views`.

    `pick`: the coordinates a big model's audit samples (audit.sample): every vector and
    model of the replay holds those only, and its `wire` is empty (a chunked model's
    frames are read by the audit's Opener, from the recording)."""
    clear: dict[tuple[int, int, int], np.ndarray] = {}
    by_view: dict[tuple[int, int, int, int], np.ndarray] = {}
    released: dict[tuple[int, int, int, int, int], np.ndarray] = {}
    cores: dict[tuple[int, int], _Witness] = {}
    (plan,) = session_plans(problem, [(strategy, scheme, repeat)])
    # the ground truth is the float64 model, whatever a run's telemetry rounds it to
    plan = replace(plan, models_f4=False)
    if noise_keys is not None:
        plan = replace(plan, specs=[replace(s, noise_key=noise_keys[s.agent]) for s in plan.specs])
    seen = SessionWire()

    dim = problem.config.dim

    def tap(_publisher: str, frame: Publish) -> None:
        if topics.parse_peer_topic(frame.topic) is not None:
            add_frame(seen, frame.payload, partial(wire.peek_peer, dim=dim))

    witness = partial(
        _Witness,
        clear=clear,
        losses=losses,
        views=by_view,
        released=released,
        cores=cores,
        pick=pick,
    )
    script = None if views is None else [replace(v, session=0) for v in views]
    # The visible wire: its frames carry what sealed ones carry under the seal (the audit
    # opens the run's own with the escrowed keys), and `wire` is read as a reader would.
    # Every model every round, whatever the run's --models-every: the ground truth of the
    # rounds between the models a run's telemetry carried (in memory they cost no wire).
    network = Network.build(
        [plan],
        core=witness,
        tap=tap if pick is None else None,
        script=script,
        seal_links=False,
        models_every=1,
    )
    models = network.play()[0].models
    if pick is not None:
        models = models[..., pick]
    for view in views or ():
        members = {m: cores[(view.view, m)] for m in view.members if (view.view, m) in cores}
        last = (reach or {}).get(view.view, 0)
        if members and last > min(core.until for core in members.values()):
            _run_on(members, last)
    return Replay(clear, models, seen, by_view, released)


def _run_on(cores: Mapping[int, _Witness], until: int) -> None:
    """One view's witnesses, held at the round the next view starts from, run on through
    `until` among themselves (the view's frames, delivered in order): the rounds the
    network began under this view. What they send is noted in `views` only."""
    queue: deque[Message] = deque()
    for core in cores.values():
        core.clear = {}  # these rounds do not stand: the next view redid them
        queue.extend(core.start(until))
    while queue:
        msg = queue.popleft()
        target = cores.get(getattr(msg, "receiver", ORCHESTRATOR))
        if target is None:  # a Report, or a frame for an agent not in the view
            continue
        with contextlib.suppress(Rejected):
            queue.extend(target.receive(msg))


@dataclass
class SessionWire:
    """The peer messages of one session, as an eavesdropper decodes them: `models` by
    (sender, receiver, round, step), the latest view's where a round was redone; `views`
    every one by (view, sender, receiver, round, step); `setups`: who got a Setup of each
    view (the members, as the signed control frames say)."""

    models: dict[tuple[int, int, int, int], np.ndarray] = field(default_factory=dict)
    keys: int = 0
    undecodable: int = 0
    sealed: int = 0  # sealed frames no escrowed key opens
    duplicates: int = 0
    views: dict[tuple[int, int, int, int, int], np.ndarray] = field(default_factory=dict)
    view_keys: Counter[int] = field(default_factory=Counter)
    setups: dict[int, set[int]] = field(default_factory=dict)
    latest: dict[tuple[int, int, int, int], int] = field(default_factory=dict)  # slot -> view


def add_frame(
    session: SessionWire, payload: bytes, read: Callable[[bytes], wire.Peer | None]
) -> None:
    """Note one peer frame of `session`, read by `read`: a model, a key frame, a chunk of a
    model not whole yet (None), or one that would not open (counted as sealed or
    undecodable)."""
    try:
        msg = read(payload)
    except Rejected as exc:
        if exc.reason is Reason.SEALED:
            session.sealed += 1
        else:
            session.undecodable += 1
        return
    if msg is None:
        return
    if isinstance(msg, KeyPlan | KeyShare):
        session.keys += 1
        session.view_keys[msg.view] += 1
        return
    slot = (msg.sender, msg.receiver, msg.round, msg.step)
    if (msg.view, *slot) in session.views:
        session.duplicates += 1
    vector = np.asarray(msg.vector)
    session.views[(msg.view, *slot)] = vector
    if session.latest.get(slot, msg.view) <= msg.view:
        session.latest[slot] = msg.view
        session.models[slot] = vector


def session_views(
    membership: Sequence[View] | None, session: int, seen: SessionWire, agents: int
) -> list[View] | None:
    """The views `session` ran under: membership.json's, with a first view it lacks read
    off the signed Setups on the wire (the file is rewritten at each change, so a later
    session that kept its first view may be missing from it). None when the session ran
    under one view of every agent, as in every run without membership changes."""
    known = {v.view: v for v in membership or () if v.session == session}
    for number, members in sorted(seen.setups.items()):
        if number in known:
            continue
        if number:
            raise AuditError(
                f"view {number} of session {session} is on the wire but not in membership.json:"
                " audit the run's own directory (it holds the membership.json of the run)"
            )
        known[0] = View(session, 0, 1, tuple(sorted(members)), "start", dict.fromkeys(members, 0))
    views = [known[number] for number in sorted(known)]
    if len(views) == 1 and views[0].members == tuple(range(agents)) and views[0].start == 1:
        return None
    return views or None
