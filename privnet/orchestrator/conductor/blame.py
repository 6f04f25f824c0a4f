"""Who stalls the network, and for how long a member that keeps doing it stays out.

A member whose frames keep getting lost (its broker connection drops again and again, or
an insider holding its credentials keeps taking the connection over) is never silent for a
deadline: its heartbeats go out between the drops. What the others see is a stall: the
slowest members all wait for it. Each stall costs them a deadline, so a member named by
two stalls within `WINDOW` deadlines is treated as an outage, once: left out of the next
view like a silent one. It asks back in (its Rejoin) at once, and is let back through the
normal rejoin path once it has stayed out `quarantine` (a deadline, doubled for each time
it was left out this way). A stall with no single agent every waiting member waits for (a
broker restart: everyone waits for everyone) blames nobody.

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


def culprit(waiting: Mapping[int, tuple[int, ...]], slowest: Iterable[int]) -> int | None:
    """The one agent every waiting member among `slowest` waits for (itself aside), if
    there is exactly one such agent and it is waited for at all; else None."""
    lists = {m: set(waiting.get(m, ())) for m in slowest}
    lists = {m: w for m, w in lists.items() if w}
    counts = Counter(a for w in lists.values() for a in w)
    named = [
        a
        for a in counts
        if all(a in w for m, w in lists.items() if m != a) and any(m != a for m in lists)
    ]
    return named[0] if len(named) == 1 else None


@dataclass
class Blame:
    """Stalls each member was named by, how often each was left out for them, and the
    Rejoins parked until their quarantine ends."""

    deadline: float
    named: dict[int, list[float]] = field(default_factory=dict)  # agent -> stall times
    outs: Counter[int] = field(default_factory=Counter)  # agent -> times left out for stalls
    until: dict[int, float] = field(default_factory=dict)  # agent -> end of its quarantine
    parked: dict[int, control.Rejoin] = field(default_factory=dict)  # asked back in early

    def stall(self, agent: int, now: float) -> bool:
        """`agent` stalled the network at `now`: True when that makes it an outage (it
        stalled FLAPS times within the window, or it was let back from a quarantine and
        stalls again)."""
        since = now - WINDOW * self.deadline
        times = [t for t in self.named.get(agent, []) if t > since] + [now]
        self.named[agent] = times
        if len(times) < FLAPS and not self.outs[agent]:
            return False
        self.outs[agent] += 1
        self.named[agent] = []
        quarantine = min(2 ** (self.outs[agent] - 1), QUARANTINE_MAX) * self.deadline
        self.until[agent] = now + quarantine
        return True

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
