"""Collection: what the agents send up besides control (every member's model after every
round, sealed telemetry; link keys, escrowed for an audit; what each dropped at the end),
and what the orchestrator sends down, signed and counted as the agents count theirs.
"""

from __future__ import annotations

import math
import mmap
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Literal

import numpy as np

from privnet.agent import control, keys, topics, wire
from privnet.agent.messages import (
    METRIC_COUNT,
    Metrics,
    Part,
    Reason,
    Rejected,
    Report,
    Telemetered,
)
from privnet.agent.protocol import Publish, Traffic, escrow_context, telemetry_context

Link = tuple[int, int]  # (a, b), a < b


@dataclass
class Pieces:
    """A model arriving in Parts, written straight into its slot of the session's models:
    the offsets of the parts in, and column 0's value, held back until every part is (a
    slot's column 0 is NaN while its model is not in: the mark every reader uses)."""

    offsets: set[int] = field(default_factory=set)
    first: float = math.nan


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


DENSE_BYTES = 256 << 20  # a session's models array above this is allocated page by page


def blank_models(rounds: int, agents: int, dim: int) -> np.ndarray:
    """(rounds, P, M) with no model in: NaN. A big one is zeros with NaN in column 0, the
    mark of a missing model every reader uses, on a mapping of its own: the OS maps its
    pages only when written, 4 KiB at a time (numpy's own would ask for 2 MiB huge pages,
    one per model that column 0 touches), so a session of 1M-parameter models takes
    memory only for the rounds whose models came."""
    size = rounds * agents * dim * 8
    if size <= DENSE_BYTES:
        return np.full((rounds, agents, dim), np.nan)
    models = np.frombuffer(mmap.mmap(-1, size), dtype=np.float64).reshape(rounds, agents, dim)
    models[..., 0] = np.nan
    return models


def model_round(round_: int, every: int, rounds: int) -> bool:
    """Whether agents send their true model after `round_`: every K rounds, and the last."""
    return round_ % every == 0 or round_ == rounds


@dataclass
class Collection:
    """The current session's telemetry as the members report it (their metrics every
    round, their models every `every` rounds), and the run's escrow."""

    run: str
    identity: keys.Identity
    models: np.ndarray = field(default_factory=lambda: np.zeros((0, 0, 0)))  # (rounds, P, M)
    metrics: np.ndarray = field(default_factory=lambda: np.zeros((0, 0, METRIC_COUNT)))
    reported: np.ndarray = field(default_factory=lambda: np.zeros((0, 0), dtype=bool))  # metrics
    done: np.ndarray = field(default_factory=lambda: np.zeros((0, 0), dtype=bool))  # (rounds, P)
    counts: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))  # per agent
    every: int = 1  # models every K rounds
    dtype: str = wire.DTYPE  # how the models travel (wire.telemetry_dtype)
    pieces: dict[tuple[int, int], Pieces] = field(default_factory=dict)  # (round, agent)
    # (session, view) -> {link: key}, as the agents escrowed them (--audit)
    link_keys: dict[tuple[int, int], dict[Link, bytes]] = field(default_factory=dict)
    # the agents' answers to Close (their Left): what each dropped after its last Finished
    farewells: dict[int, dict[str, int]] = field(default_factory=dict)
    farewell_traffic: Traffic = field(default_factory=Traffic)  # their Left frames

    def new_session(
        self, rounds: int, agents: int, dim: int, every: int = 1, dtype: str = wire.DTYPE
    ) -> None:
        self.models = blank_models(rounds, agents, dim)
        self.metrics = np.full((rounds, agents, METRIC_COUNT), np.nan)
        self.done = np.zeros((rounds, agents), dtype=bool)
        self.reported = np.zeros((rounds, agents), dtype=bool)
        self.counts = np.zeros(agents, dtype=np.int64)
        self.every, self.dtype, self.pieces = every, dtype, {}

    def _recount(self) -> None:
        self.counts = self.done.sum(axis=0)

    def _blank(self, rounds: slice, agents: int | slice = slice(None)) -> None:
        """No model in those slots: NaN (a big array: zeros with NaN in column 0)."""
        self.models[rounds, agents] = np.nan if self.models.size <= DENSE_BYTES // 8 else 0.0
        self.models[rounds, agents, 0] = np.nan

    def redo(self, start: int) -> None:
        """Rounds from `start` on are redone (or never done) under a new view."""
        self._blank(slice(start - 1, None))
        self.metrics[start - 1 :] = np.nan
        self.done[start - 1 :] = self.reported[start - 1 :] = False
        self.pieces = {k: v for k, v in self.pieces.items() if k[0] < start}
        self._recount()

    def restore(self, models: np.ndarray, metrics: np.ndarray | None, start: int) -> None:
        """A resumed run: the rounds before `start`, as the first run recorded them (a
        round is in where its metrics are, or, of a journal without them, its models)."""
        self.models[: start - 1] = models[: start - 1]
        have = ~np.isnan(models[: start - 1, :, 0])
        if metrics is not None:
            self.metrics[: start - 1] = metrics[: start - 1]
            have |= ~np.isnan(metrics[: start - 1]).all(axis=2)
        self.done[: start - 1] = self.reported[: start - 1] = have
        self._recount()

    def first_gap(self, first: int, start: int, members: Iterable[int]) -> int:
        """The first round from `first` on, before `start`, that lacks a report of one of
        `members` (`start` if none does)."""
        missing = ~self.done[first - 1 : start - 1, sorted(members)]
        gaps = np.flatnonzero(missing.any(axis=1))
        return first + int(gaps[0]) if gaps.size else start

    def through(self, members: np.ndarray, since: int) -> int:
        """The last round every one of `members` has reported, given that the first `since`
        are: rows from there on, one at a time, so a call on every delivery costs the few
        rows reported since the last."""
        done, rounds = since, self.done.shape[0]
        while done < rounds and self.done[done, members].all():
            done += 1
        return done

    def telemetry(self, msg: control.Telemetry, session: int, dim: int, end: int) -> None:
        """Store a member's telemetry of rounds up to `end` (its view's last that stands):
        all of a message or none of it, each round's metrics and model (or part) once."""
        context = telemetry_context(self.run, msg.agent, session, msg.view, msg.round)
        try:
            blob = keys.open_sealed(self.identity.static, msg.sealed, context)
        except keys.BadKey as exc:
            raise Rejected(Reason.BAD_SEAL, f"telemetry of agent {msg.agent}: {exc}") from exc
        items = wire.decode_telemetry(blob, dim, self.dtype)
        rounds = self.models.shape[0]
        for item in items:
            self._check(item, msg, rounds, end)
        for item in items:
            r, m = item.round - 1, item.sender
            if isinstance(item, Metrics):
                self.metrics[r, m] = wire.metric_values(item)
                self.reported[r, m] = True
            elif isinstance(item, Report):
                self.models[r, m] = item.w
            else:
                self._place(item, dim)
            self._complete(item.round, m)

    def _place(self, part: Part, dim: int) -> None:
        """A part into its model's slot (no buffer of its own, no copy of the whole model);
        column 0 once every part is in."""
        r, m, at, end = part.round - 1, part.sender, part.offset, part.offset + len(part.w)
        got = self.pieces.setdefault((part.round, m), Pieces())
        if at == 0:
            got.first = float(part.w[0])
            self.models[r, m, 1:end] = part.w[1:]
        else:
            self.models[r, m, at:end] = part.w
        got.offsets.add(at)
        if len(got.offsets) == wire.part_count(dim, self.dtype):
            self.models[r, m, 0] = self.pieces.pop((part.round, m)).first

    def unfinished(self) -> None:
        """The session is over: a model whose parts did not all come is no model (its slot
        blank again, as if none had)."""
        for round_, m in self.pieces:
            self._blank(slice(round_ - 1, round_), m)
        self.pieces = {}

    def _check(self, item: Telemetered, msg: control.Telemetry, rounds: int, end: int) -> None:
        if item.sender != msg.agent or not 1 <= item.round <= rounds:
            raise Rejected(
                Reason.SCHEMA, f"agent {msg.agent} reported agent {item.sender}, round {item.round}"
            )
        if item.round > end:
            raise Rejected(
                Reason.STALE_VIEW, f"round {item.round} of view {msg.view}, which ended at {end}"
            )
        r, m = item.round - 1, item.sender
        if isinstance(item, Metrics):
            again = bool(self.reported[r, m])
        elif isinstance(item, Part):
            got = self.pieces.get((item.round, m))
            again = not np.isnan(self.models[r, m, 0]) or bool(got and item.offset in got.offsets)
        else:
            again = not np.isnan(self.models[r, m, 0])
        if again:
            raise Rejected(Reason.DUPLICATE, f"round {item.round} of agent {msg.agent} again")

    def _complete(self, round_: int, agent: int) -> None:
        """Mark a round in for an agent once its metrics and (at a model round) its model are."""
        r = round_ - 1
        if self.done[r, agent] or not self.reported[r, agent]:
            return
        if model_round(round_, self.every, self.models.shape[0]) and np.isnan(
            self.models[r, agent, 0]
        ):
            return
        self.done[r, agent] = True
        self.counts[agent] += 1

    def farewell(self, msg: control.Left) -> dict[int, dict[str, int]]:
        """An agent's answer to Close: what it dropped since its last Finished (every
        answer so far returned)."""
        if msg.agent in self.farewells:
            raise Rejected(Reason.DUPLICATE, f"second Left of agent {msg.agent}")
        self.farewells[msg.agent] = msg.rejected
        return self.farewells

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
