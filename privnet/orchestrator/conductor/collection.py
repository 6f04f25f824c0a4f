"""Collection: what the agents send up besides control (every member's model after every
round, sealed telemetry; link keys, escrowed for an audit; what each dropped at the end),
and what the orchestrator sends down, signed and counted as the agents count theirs.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Literal

import numpy as np

from privnet.agent import control, keys, topics, wire
from privnet.agent.messages import Reason, Rejected
from privnet.agent.protocol import Publish, Traffic, escrow_context, telemetry_context

Link = tuple[int, int]  # (a, b), a < b


@dataclass
class Outbox:
    """The orchestrator's control frames: signed, numbered, counted."""

    run: str
    identity: keys.Identity
    agents: int
    seq: int = 0
    traffic: Traffic = field(default_factory=Traffic)  # what it published
    recipients: int = 0  # deliveries of what it published (a broadcast reaches everyone)
    broadcasts: int = 0  # frames to every agent (a Beat among them)

    def down(self, to: int | Literal["all"], msg: control.Control) -> Publish:
        self.seq += 1
        topic = topics.ctl_down(self.run, to)
        payload = wire.encode_signed(msg, self.run, self.seq, self.identity)
        self.traffic.add("control", topic, payload)
        self.recipients += self.agents if to == "all" else 1
        self.broadcasts += to == "all"
        return Publish(topic, payload, "control")


@dataclass
class BeatGaps:
    """The longest time between two frames the orchestrator sent to every agent (the
    agents' evidence that it lives) while a session ran: what `--deadline` must cover."""

    last: float | None = None
    longest: float = 0.0

    def note(self, now: float) -> None:
        if self.last is not None:
            self.longest = max(self.longest, now - self.last)
        self.last = now


@dataclass
class Collection:
    """The current session's models as the members report them, and the run's escrow."""

    run: str
    identity: keys.Identity
    models: np.ndarray = field(default_factory=lambda: np.zeros((0, 0, 0)))  # (rounds, P, M)
    counts: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))  # per agent
    # (session, view) -> {link: key}, as the agents escrowed them (--audit)
    link_keys: dict[tuple[int, int], dict[Link, bytes]] = field(default_factory=dict)
    left: dict[int, dict[str, int]] = field(default_factory=dict)  # dropped after the end
    left_traffic: Traffic = field(default_factory=Traffic)  # the agents' Left frames

    def new_session(self, rounds: int, agents: int, dim: int) -> None:
        self.models = np.full((rounds, agents, dim), np.nan)
        self.counts = np.zeros(agents, dtype=np.int64)

    def _recount(self) -> None:
        self.counts = (~np.isnan(self.models[..., 0])).sum(axis=0)

    def redo(self, start: int) -> None:
        """Rounds from `start` on are redone (or never done) under a new view."""
        self.models[start - 1 :] = np.nan
        self._recount()

    def restore(self, models: np.ndarray, start: int) -> None:
        """A resumed run: the rounds before `start`, as the first run recorded them."""
        self.models[: start - 1] = models[: start - 1]
        self._recount()

    def first_gap(self, first: int, start: int, members: Iterable[int]) -> int:
        """The first round from `first` on, before `start`, that lacks a report of one of
        `members` (`start` if none does)."""
        missing = np.isnan(self.models[first - 1 : start - 1, sorted(members), 0])
        gaps = np.flatnonzero(missing.any(axis=1))
        return first + int(gaps[0]) if gaps.size else start

    def telemetry(self, msg: control.Telemetry, session: int, dim: int, end: int) -> None:
        """Store a member's reports of rounds up to `end` (its view's last that stands);
        all or none, each round once."""
        context = telemetry_context(self.run, msg.agent, session, msg.view, msg.round)
        try:
            blob = keys.open_sealed(self.identity.static, msg.sealed, context)
        except keys.BadKey as exc:
            raise Rejected(Reason.BAD_SEAL, f"telemetry of agent {msg.agent}: {exc}") from exc
        reports = wire.decode_reports(blob, dim)
        rounds = self.models.shape[0]
        for report in reports:
            if report.sender != msg.agent or not 1 <= report.round <= rounds:
                raise Rejected(
                    Reason.SCHEMA,
                    f"agent {msg.agent} reported agent {report.sender}, round {report.round}",
                )
            if report.round > end:
                raise Rejected(
                    Reason.STALE_VIEW,
                    f"round {report.round} of view {msg.view}, which ended at {end}",
                )
            if not np.isnan(self.models[report.round - 1, report.sender, 0]):
                raise Rejected(Reason.DUPLICATE, f"round {report.round} of agent {msg.agent} again")
        for report in reports:
            self.models[report.round - 1, report.sender] = report.w
            self.counts[report.sender] += 1

    def escrowed(self, msg: control.Escrow, session: int) -> None:
        """Keep an agent's link keys of a view; both ends of a link must escrow the same."""
        context = escrow_context(self.run, msg.agent, session, msg.view)
        try:
            blob = keys.open_sealed(self.identity.static, msg.sealed, context)
        except keys.BadKey as exc:
            raise Rejected(Reason.BAD_SEAL, f"escrow of agent {msg.agent}: {exc}") from exc
        escrowed = self.link_keys.setdefault((session, msg.view), {})
        for peer, key in wire.decode_link_keys(blob).items():
            link = (min(msg.agent, peer), max(msg.agent, peer))
            if escrowed.setdefault(link, key) != key:
                raise Rejected(
                    Reason.SCHEMA,
                    f"agent {msg.agent} escrowed another key for link {link} than {peer}",
                )
