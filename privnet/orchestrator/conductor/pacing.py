"""Pacing: how far ahead of what the conductor has read the members may run, and when it
sends the next Beat (its proof of life) and how long the gaps between them grew."""

from __future__ import annotations

from dataclasses import dataclass, field

from privnet.agent.protocol import BEATS, HISTORY_BYTES

# Rounds the members may run past what the conductor has read of them (1024, not 256: a
# broker killed while every member holds at the window's end loses queued telemetry that no
# stall redoes, docs/tasks/liveness.md). The conductor grants
# WINDOW more (a Go with a later `until`) each time they are halfway through: a busy
# orchestrator slows the run, and its view of the network, its faults and its decisions stay
# at most WINDOW rounds behind the agents, instead of a backlog without bound (issue 30).
WINDOW = 1024
# The models an agent keeps of rounds the conductor has recorded, at most about (in bytes,
# at 8 a parameter): a Recorded goes out once the members' reports free this much of it, so
# a 1M-parameter model's history is pruned every round and a 2-parameter one's never.
RECORDED_BYTES = HISTORY_BYTES


def recorded_step(dim: int) -> int:
    """Rounds between two Recorded for models of `dim` parameters."""
    return max(1, RECORDED_BYTES // (8 * dim))


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
class Pacing:
    """The current view's grant (Go's `until`) and its own last round, when the session's
    first Go went out, and the Beats' schedule."""

    deadline: float
    granted: int = 0  # the last round the members may run in this view (Go's `until`)
    final: int = 0  # the view's own last round: Go's `until` once fully granted
    recorded: int = 0  # the last round a Recorded said every member's reports are in
    go_at: float = 0.0  # the session's first Go (0: none yet); its wall time runs from it
    next_beat: float = 0.0
    beats: BeatGaps = field(default_factory=BeatGaps)  # measured as they are sent

    def go(self, start: int, until: int) -> int:
        """A view from `start` to `until`: the first grant, at most WINDOW rounds."""
        self.final, self.granted = until, min(until, start - 1 + WINDOW)
        self.recorded = start - 1
        return self.granted

    @property
    def whole(self) -> bool:
        """The view is granted to its last round: no more Go until the next view."""
        return self.granted >= self.final

    def more(self, done: int) -> int | None:
        """WINDOW more rounds once the members are halfway through the last grant (None:
        not yet, or the view is granted whole)."""
        if self.whole or done + WINDOW // 2 < self.granted:
            return None
        self.granted = min(self.final, done + WINDOW)
        return self.granted

    def beat_due(self, now: float) -> bool:
        """Whether a Beat is due at `now` (the next one is scheduled if so)."""
        if now < self.next_beat:
            return False
        self.schedule(now)
        return True

    def schedule(self, now: float) -> None:
        """The next Beat a beat period from `now` (BEATS per deadline)."""
        self.next_beat = now + self.deadline / BEATS
