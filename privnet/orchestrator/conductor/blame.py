"""Who stalls the network, and for how long a member that keeps doing it stays out.

A member whose frames keep getting lost (its broker connection drops again and again, or
an insider holding its credentials keeps taking the connection over) is never silent for a
deadline: its heartbeats go out between the drops. What the others see is a stall: the
slowest members all wait for it. Each stall costs them a deadline, so a member named by
two stalls within `WINDOW` deadlines is treated as an outage, once: left out of the next
view like a silent one. It asks back in (its Rejoin) at once, and is let back through the
normal rejoin path once it has stayed out its quarantine (a deadline, doubled for each time
it was left out this way); named by a stall after that, it is out again at once. A stall
whose waits share no agent (a broker restart: everyone waits for everyone) names nobody.

Plain bookkeeping: the conductor feeds it heartbeats and stalls and reads its answers.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from privnet.agent import control

FLAPS = 2  # stalls naming one member within WINDOW deadlines: it is an outage
WINDOW = 20.0  # in deadlines
QUARANTINE_MAX = 64  # deadlines a member left out for stalling stays out, at most


def suspects(waiting: Mapping[int, tuple[int, ...]], slowest: Iterable[int]) -> set[int]:
    """The agents on every wait of the members a stall holds back (`slowest` waits for
    whom `waiting` says): one where several waits share it, both ends of a single wait
    (frames lost on one link: either end's connection may have dropped them), none where
    the waits share no agent (a broker restart: everyone waits for everyone)."""
    edges = [(m, a) for m in slowest for a in waiting.get(m, ()) if a != m]
    if not edges:
        return set()
    common = set(edges[0])
    for edge in edges[1:]:
        common &= set(edge)
    return common


@dataclass
class Blame:
    """Stalls each member was named by, how often each was left out for them, and the
    Rejoins parked until their quarantine ends."""

    deadline: float
    named: dict[int, list[float]] = field(default_factory=dict)  # agent -> stall times
    outs: Counter[int] = field(default_factory=Counter)  # agent -> times left out for stalls
    until: dict[int, float] = field(default_factory=dict)  # agent -> end of its quarantine
    parked: dict[int, control.Rejoin] = field(default_factory=dict)  # asked back in early

    def stall(self, suspects: Iterable[int], now: float) -> int | None:
        """A stall named `suspects` at `now`: the one that is now an outage (named by
        FLAPS stalls within the window, or named again after a quarantine), or None (no
        one, or two equally: the stall is redone with everyone)."""
        since = now - WINDOW * self.deadline
        due = []
        for agent in suspects:
            times = [t for t in self.named.get(agent, []) if t > since] + [now]
            self.named[agent] = times
            if len(times) >= FLAPS or self.outs[agent]:
                due.append(agent)
        if len(due) != 1:
            return None
        (agent,) = due
        self.outs[agent] += 1
        self.named[agent] = []
        quarantine = min(2 ** (self.outs[agent] - 1), QUARANTINE_MAX) * self.deadline
        self.until[agent] = now + quarantine
        return agent

    def park(self, rejoin: control.Rejoin, now: float) -> bool:
        """Keep a Rejoin that came during its agent's quarantine (True), to let it in once
        the quarantine ends (`due`)."""
        if now >= self.until.get(rejoin.agent, 0.0):
            return False
        self.parked[rejoin.agent] = rejoin
        return True

    def due(self, now: float) -> list[control.Rejoin]:
        """Parked Rejoins whose quarantine has ended, taken out."""
        done = [a for a in self.parked if now >= self.until.get(a, 0.0)]
        return [self.parked.pop(a) for a in sorted(done)]

    def next_due(self) -> float | None:
        times = [self.until.get(a, 0.0) for a in self.parked]
        return min(times) if times else None
