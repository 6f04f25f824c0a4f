"""Time, for the conductor: the deadlines it keeps (registration, an agent's silence, a
stalled network, a quarantine's end, a hold not answered, the Lefts) and the Beats it
sends, its proof of life. Like the `Steward` it keeps no state of its own: the silences
are the registry's, the stalls the membership's and the blame's, the Beats' schedule the
pacing's; it decides on them when `Conductor.tick` hands it the time.
"""

from __future__ import annotations

from privnet.agent import control
from privnet.agent.protocol import Output
from privnet.orchestrator.conductor.blame import suspects
from privnet.orchestrator.conductor.membership import splits
from privnet.orchestrator.conductor.owner import Owner
from privnet.orchestrator.conductor.records import BEAT_STAGES, IN_SESSION, Stage
from privnet.orchestrator.conductor.steward import Steward


class Liveness:
    """The conductor's deadlines and Beats, on the parts of the conductor it serves."""

    def __init__(self, conductor: Owner, steward: Steward) -> None:
        self.c, self.steward = conductor, steward

    def tick(self, now: float) -> Output:
        """Deadlines (registration, an agent's silence, a stalled network) and Beats."""
        c = self.c
        sent, beating = c.outbox.broadcasts, c.stage in BEAT_STAGES
        out = self._tick(now)
        if beating and c.outbox.broadcasts != sent:
            c.pacing.beats.note(now)
        return out

    def _tick(self, now: float) -> Output:
        c = self.c
        if c.stage is Stage.REGISTERING and now - c.since >= c.register_deadline:
            missing = c.registry.missing()
            return c.fail(
                f"registration closed after {c.register_deadline:.0f} s; agents "
                f"{missing[:20]} never registered (not started, or launched with another "
                "run's token?)"
            )
        out = self._waits(now) if c.stage in IN_SESSION else Output()
        if c.stage is Stage.CLOSING and now - c.since >= c.deadline:
            return out + self.steward.done()  # results are complete; a silent agent costs its Left
        if c.stage in BEAT_STAGES and c.pacing.beat_due(now):
            beat = control.Beat() if c.stage is not Stage.HOLDING else self.steward.hold()
            out.publish.append(c.down("all", beat))
        return out

    def next_tick(self) -> float | None:
        c = self.c
        if c.stage is Stage.REGISTERING:
            return c.since + c.register_deadline
        if c.stage in BEAT_STAGES:
            return min(self.deadline_at(), c.pacing.next_beat)
        return None

    def deadline_at(self) -> float:
        """When the next wait runs out: registration, the oldest silence, a stall, Lefts."""
        c = self.c
        if c.stage is Stage.REGISTERING:
            return c.since + c.register_deadline
        if c.stage is Stage.CLOSING:
            return c.since + c.deadline
        membership = c.membership
        oldest = c.registry.oldest(membership.expects)
        waits = [oldest + c.deadline] if oldest is not None else []
        if self.may_stall:  # else a past stall time would be due for ever (a busy loop)
            waits.append(membership.moved.since + c.deadline)
        if c.stage is Stage.HOLDING and membership.split_due is not None:
            waits.append(membership.split_due)  # a split view waits this long at most
        if (parked := c.blame.next_due()) is not None:
            waits.append(parked)  # a member in quarantine asked back in
        return min(waits) if waits else c.pacing.next_beat

    @property
    def may_stall(self) -> bool:
        """Keying or running, not replaying, and rounds left to run."""
        c = self.c
        return (
            c.stage in (Stage.CONFIGURING, Stage.RUNNING)
            and c.script is None
            and c.rounds_done < c.plans[c.session].rounds
        )

    def _waits(self, now: float) -> Output:
        """In a session: a member silent for a deadline, a stall, a quarantine's end, a
        hold a member did not answer within a deadline (or a split view waited out)."""
        c, out = self.c, Output()
        membership, heard, deadline = c.membership, c.registry.heard, c.deadline
        for m in [m for m in membership.expected() if now - heard.get(m, 0.0) >= deadline]:
            out += c.lost(m, f"silent for {deadline:.0f} s", now)
        if self.may_stall and now - membership.moved.since >= deadline:
            out += self._stall(now)
        for rejoin in c.blame.due(now):  # out of quarantine: back in as any Rejoin
            if self.steward.can_join(rejoin.agent):
                membership.joining[rejoin.agent] = rejoin
                out += self.steward.change(now, "returned")
        due = membership.split_due
        if c.stage is Stage.HOLDING and due is not None and now >= due:
            membership.split_due = None
            staying = membership.expected()
            unheld = staying - membership.held.keys()
            if 2 * len(unheld) < len(staying):  # a few hold the others up: a deadline at most
                why = f"did not stop for a view change in {deadline:g} s"
                for m in sorted(unheld):
                    out += c.lost(m, why, now)
            elif unheld:  # most of them are slow (a busy machine): wait on, and look again
                membership.split_due = now + deadline
            out += self.steward.maybe_switch(now)  # nobody came back to join a split network
        return out

    def _stall(self, now: float) -> Output:
        """Every member alive, and the slowest one no further for a deadline (keying: no
        Go within a deadline of the Setups): frames were lost (a broker restart, say); the
        round, or the keying, is redone under a new view. A member the held-back members'
        waits keep naming (`blame`) is left out instead, unless the others' graph would
        split without it."""
        c, membership = self.c, self.c.membership
        held_back = membership.slowest(c.collection.counts, c.stage is Stage.CONFIGURING)
        members, plan = membership.members, c.plans[c.session]
        named = {
            m
            for m in suspects(membership.waiting, held_back)
            if m in members and not splits(plan, members - {m}, c.agents)
        }
        agent = c.blame.stall(named, now)
        if agent is None:
            return self.steward.change(now, "stalled")
        why = f"stalled the network (left out {c.blame.outs[agent]} time(s) for it)"
        return c.lost(agent, why, now)
