"""What an agent holds of a session, apart from the protocol that moves it (`privnet.agent.node`).

Opening a Setup (its sealed Config, the neighbours' keys, the models it may resume from),
carrying a session over to its next view, sealing what goes to the orchestrator (telemetry,
escrowed link keys), and the peer frames that wait for a view: all of it is bookkeeping the
node's phases only call, so it lives here and the node reads as the protocol.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from privnet.agent import control, keys, wire
from privnet.agent.core import AgentCore
from privnet.agent.links import Links
from privnet.agent.messages import Metrics, Reason, Rejected, Report, Telemetered
from privnet.agent.protocol import (
    HISTORY_BYTES,
    Checkpoint,
    Traffic,
    escrow_context,
    setup_context,
    telemetry_context,
)
from privnet.agent.spec import AgentSpec

EARLY_COUNT = 4096  # peer frames kept while no session is configured...
EARLY_BYTES = 16 << 20  # ...and their bytes; beyond either, dropped as "overflow"
RECENT = 64  # rounds a Rejoin offers (`offered`)
TELEMETRY_BATCH = 10  # rounds per sealed telemetry message (fewer for big models)...
TELEMETRY_RATE = 40  # ...more over 400 agents: about this many messages a round in all
MAX_TELEMETRY_BATCH = 25  # ...up to this many: what a lost agent's unsent telemetry costs


def telemetry_batch(agents: int) -> int:
    """Rounds per telemetry message in a network of `agents`. Every message costs the
    orchestrator a signature check, a key agreement and a decode whatever it carries, so a
    large network's agents batch more rounds (25 at 1000 agents: 40 messages a round, not
    100), bounded by what an agent that dies loses of its unsent rounds and by how far the
    live view may lag."""
    return min(MAX_TELEMETRY_BATCH, max(TELEMETRY_BATCH, math.ceil(agents / TELEMETRY_RATE)))


def telemetry_rounds(agents: int, dim: int) -> int:
    """Rounds per telemetry message for `agents` agents of `dim` parameters: fewer than
    `telemetry_batch` where the models of the unsent rounds pass HISTORY_BYTES, since the
    agent holds each round's model until the conductor has its report (a Recorded frees it):
    every round at 1M parameters, so it holds the few rounds a Recorded lags behind, not
    a batch's ten (80 MB of float64 at 1M)."""
    return max(1, min(telemetry_batch(agents), HISTORY_BYTES // (8 * dim)))


@dataclass(frozen=True)
class Sealing:
    """Who seals and for whom: this agent of this run, and its orchestrator's key."""

    run: str
    me: int
    orchestrator: keys.PublicIdentity


@dataclass
class Session:
    number: int
    view: int
    config: control.Config
    core: AgentCore
    links: Links
    history: dict[int, np.ndarray]  # round -> own model after it, on this view's branch
    began: float | None = None  # when its first Go came: Finished's wall time is since
    reports: list[Telemetered] = field(default_factory=list)  # telemetry not yet sealed
    traffic: Traffic = field(default_factory=Traffic)
    finished: Counter[str] = field(default_factory=Counter)  # rejections in a voided Finished

    def next_view(
        self,
        view: int,
        config: control.Config,
        core: AgentCore,
        links: Links,
        history: dict[int, np.ndarray],
    ) -> Session:
        """The next view of this session: traffic, the time it began and the unsent telemetry
        of rounds that stand (up to the one resumed from) carry over."""
        stand = [r for r in self.reports if r.round <= config.resume]
        return Session(
            self.number, view, config, core, links, history, self.began, stand, self.traffic
        )

    def wall(self, now: float) -> float:
        """Seconds since the session's first Go (0 before it): what Finished reports."""
        return 0.0 if self.began is None else float(now - self.began)

    def forget(self, through: int, every: int) -> None:
        """Drop the models of rounds before `through`, which the orchestrator has recorded
        (no view starts before it), but the latest checkpoint round among them: a run
        resumed from disk starts at the latest round both the journal and it hold."""
        kept = through - through % every if every else through
        for r in [r for r in self.history if r < through and r != kept]:
            del self.history[r]

    def checkpoint(self, sealing: Sealing, every: int) -> Checkpoint:
        kept = {r: w for r, w in self.history.items() if r % every == 0}
        return Checkpoint(sealing.run, sealing.me, self.number, kept)

    def note(self, report: Report) -> None:
        """Keep a round's telemetry: the agent's own metrics every round, its true model
        every `models_every` rounds and at the session's last (in Parts when too big for
        one message, float32 ones for a float32 problem: `Config.models_f4`)."""
        metrics = getattr(self.core.loss, "metrics", None)
        values = metrics(report.w, report.round) if metrics else (math.nan, math.nan)
        self.reports.append(wire.metrics(report.sender, report.round, values))
        every, last = self.config.models_every, self.core.spec.rounds
        if report.round % every == 0 or report.round == last:
            dtype = wire.telemetry_dtype(self.core.spec.dim, self.config.models_f4)
            self.reports.extend(wire.split(report, dtype))

    def due(self) -> bool:
        """Whether the telemetry kept makes a batch: `telemetry_rounds` rounds, or as many
        models as one message holds (a big model at once)."""
        rounds = sum(isinstance(item, Metrics) for item in self.reports)
        models = len(self.reports) - rounds
        spec = self.core.spec
        batch = telemetry_rounds(spec.agents, spec.dim)
        return rounds >= batch or 0 < max(1, wire.reports_per_message(spec.dim)) <= models

    def telemetry(self, sealing: Sealing) -> list[control.Telemetry]:
        """Seal the kept telemetry to the orchestrator, in as many messages as its bytes
        take: no plaintext model on the wire."""
        items, self.reports = self.reports, []
        sent = []
        for batch in wire.pack_items(items):
            last = max(item.round for item in batch)
            sealed = keys.seal(
                sealing.orchestrator.static,
                wire.encode_telemetry(batch),
                telemetry_context(sealing.run, sealing.me, self.number, self.view, last),
            )
            sent.append(control.Telemetry(sealing.me, self.number, self.view, last, sealed))
        return sent

    def escrow(self, sealing: Sealing) -> control.Escrow:
        """The view's link keys, sealed to the orchestrator: the audit opens the frames."""
        sealed = keys.seal(
            sealing.orchestrator.static,
            wire.encode_link_keys(self.links.keys),
            escrow_context(sealing.run, sealing.me, self.number, self.view),
        )
        return control.Escrow(sealing.me, self.number, self.view, sealed)


@dataclass(frozen=True)
class Opened:
    """A Setup's sealed Config, opened and checked, with the links it keys."""

    config: control.Config
    directory: dict[int, keys.PublicIdentity]
    links: Links


def open_setup(setup: control.Setup, identity: keys.Identity, run: str) -> Opened:
    """The Config sealed to this agent for the Setup's view, or Rejected."""
    me = setup.agent
    try:
        context = setup_context(run, me, setup.session, setup.view)
        plain = keys.open_sealed(identity.static, setup.sealed, context)
    except keys.BadKey as exc:
        raise Rejected(Reason.BAD_SEAL, f"Setup: {exc}") from exc
    config = wire.decode_config(plain)
    spec = config.spec
    if spec.agent != me or spec.view != setup.view:
        raise Rejected(
            Reason.SCHEMA,
            f"Config for agent {spec.agent} view {spec.view} sealed to agent {me} "
            f"for view {setup.view}",
        )
    try:
        directory = {m: keys.PublicIdentity.from_bytes(b) for m, b in config.directory.items()}
        if missing := sorted(spec.neighbours - directory.keys()):
            raise keys.BadKey(f"no identity key for neighbours {missing}")
        view = spec.view if config.seal_links else None
        link_keys = {
            m: keys.link_key(identity, pub, spec.session, me, m, view=view)
            for m, pub in directory.items()
            if m in spec.neighbours  # peer frames travel only between neighbours
        }
    except keys.BadKey as exc:
        raise Rejected(Reason.BAD_KEY, f"Config directory: {exc}") from exc
    links = Links(
        run, me, spec.dim, spec.view, link_keys, sealed=config.seal_links, dtype=spec.wire.code
    )
    return Opened(config, directory, links)


def history_for(
    current: Session | None,
    checkpoint: Checkpoint | None,
    number: int,
    spec: AgentSpec,
    start: Callable[[], np.ndarray] | None = None,
) -> dict[int, np.ndarray]:
    """The models an agent may resume from in session `number`: this session's, a
    restarted agent's checkpoint of it, or the initial model (the spec's, else `start()`,
    the problem's own, else zeros)."""
    if current is not None and current.number == number:
        return current.history
    if checkpoint is not None and checkpoint.session == number:
        return dict(checkpoint.models)
    if spec.w0:
        return {0: np.array(spec.w0, dtype=np.float64)}
    return {0: start() if start is not None else np.zeros(spec.dim)}


def offered(rounds: list[int]) -> tuple[int, ...]:
    """What a Rejoin offers of the (sorted) rounds held: at most RECENT, the latest half
    and the older ones evenly spread. A run resumed after its orchestrator died goes back to
    the last round that orchestrator recorded, which may lie far behind the latest held."""
    if len(rounds) <= RECENT:
        return tuple(rounds)
    half = RECENT // 2
    older = rounds[:-half]
    step = (len(older) - 1) / (half - 1)
    return tuple([older[round(n * step)] for n in range(half)] + rounds[-half:])


@dataclass(frozen=True, slots=True)
class EarlyFrame:
    sender: int
    payload: bytes


@dataclass
class Early:
    """Peer frames that came before the view that can authenticate them (bounded)."""

    frames: list[EarlyFrame] = field(default_factory=list)
    size: int = 0  # their bytes

    def keep(self, sender: int, payload: bytes) -> None:
        if len(self.frames) >= EARLY_COUNT or self.size + len(payload) > EARLY_BYTES:
            raise Rejected(Reason.OVERFLOW, f"more than {EARLY_COUNT} early peer frames")
        self.frames.append(EarlyFrame(sender, payload))
        self.size += len(payload)

    def take(self) -> list[EarlyFrame]:
        """Every frame kept, in order; none are kept after."""
        frames, self.frames, self.size = self.frames, [], 0
        return frames
