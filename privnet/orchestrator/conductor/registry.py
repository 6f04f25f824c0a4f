"""Registration and identities: who may speak for an agent of this run, and when it last did.

An agent registers with a Hello that proves its launch token; its identity is pinned then,
and every later upward frame must be signed by it and carry a sequence number it has not
used. The checks raise `Rejected` with exactly one reason; the conductor decides what a
frame that passes them means in its phase.
"""

from __future__ import annotations

import heapq
import hmac
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import NamedTuple

from privnet.agent import control, keys, topics, wire
from privnet.agent.messages import Reason, Rejected
from privnet.agent.protocol import hello_proof


@dataclass
class Pinned:
    """An agent's registered identity and the sequence numbers it has used under it."""

    identity: keys.PublicIdentity
    seen: set[int] = field(default_factory=set)


class Heard(NamedTuple):
    """A heap entry: `agent` was heard at `when` (stale once it is heard again)."""

    when: float
    agent: int


@dataclass
class Registry:
    """Every agent's pinned identity, and when each was last heard (who is alive is the
    membership's)."""

    run: str
    tokens: dict[int, bytes]  # agent -> its launch token
    registered: dict[int, Pinned] = field(default_factory=dict)
    heard: dict[int, float] = field(default_factory=dict)  # last valid frame of each agent
    # every `heard` update, a heap: the oldest silence without a walk over every agent per
    # delivery; an entry a later one superseded is dropped as it surfaces
    hearing: list[Heard] = field(default_factory=list)

    @property
    def complete(self) -> bool:
        return len(self.registered) == len(self.tokens)

    def missing(self) -> list[int]:
        return sorted(set(range(len(self.tokens))) - self.registered.keys())

    # ---- checks, in the order a delivery meets them -------------------------------------

    def sender(self, topic: str) -> int:
        """The agent whose upward topic this is (an agent of this run)."""
        where = topics.parse_up_topic(topic)
        if where is None or where[0] != self.run:
            raise Rejected(Reason.WRONG_TOPIC, f"the orchestrator does not read {topic!r}")
        agent = where[1]
        if agent not in self.tokens:
            raise Rejected(Reason.UNKNOWN_SENDER, f"agent {agent} is not part of this run")
        return agent

    def frame(self, agent: int, payload: bytes) -> wire.SignedFrame:
        """The decoded frame, of this run, about the agent whose topic it came on."""
        frame = wire.decode_signed(payload)
        if frame.run != self.run:
            raise Rejected(Reason.WRONG_RUN, f"frame for run {frame.run!r}, this is {self.run!r}")
        msg = frame.msg
        if getattr(msg, "agent", None) != agent:
            raise Rejected(Reason.SPOOFED, f"{type(msg).__name__} on the topic of agent {agent}")
        return frame

    def introduced(
        self, frame: wire.SignedFrame, hello: control.Hello, may_restart: bool
    ) -> keys.PublicIdentity:
        """The identity a Hello registers: signed by it, with the agent's launch token; a
        new identity of a registered agent only if it `may_restart` (in a session)."""
        agent = hello.agent
        identity = keys.PublicIdentity.from_bytes(hello.identity)  # 64 bytes: wire-checked
        frame.verify(identity, f"the identity in agent {agent}'s Hello")
        expected = hello_proof(self.tokens[agent], self.run, agent, hello.identity)
        if not hmac.compare_digest(expected, hello.proof):
            raise Rejected(Reason.BAD_PROOF, f"Hello of agent {agent} lacks its launch token")
        pinned = self.registered.get(agent)
        if pinned is not None:
            if pinned.identity == identity:
                raise Rejected(Reason.DUPLICATE, f"agent {agent} is registered already")
            if not may_restart:
                raise Rejected(Reason.IDENTITY_CHANGE, f"agent {agent} registered another identity")
        return identity

    def pin(self, agent: int, identity: keys.PublicIdentity, seq: int, now: float) -> None:
        self.registered[agent] = Pinned(identity, {seq})
        self.hear(agent, now)

    def verified(self, agent: int, frame: wire.SignedFrame) -> Pinned:
        """The agent's pin, once the frame is signed by it and its sequence number is new
        (the caller marks it used once the frame is obeyed)."""
        pinned = self.registered.get(agent)
        if pinned is None:
            raise Rejected(Reason.UNREGISTERED, f"{type(frame.msg).__name__} from agent {agent}")
        frame.verify(pinned.identity, f"agent {agent}'s registered identity")
        if frame.seq in pinned.seen:
            raise Rejected(Reason.REPLAY, f"agent {agent} already used sequence number {frame.seq}")
        return pinned

    # ---- silences ----------------------------------------------------------------------

    def hear(self, agent: int, when: float) -> None:
        self.heard[agent] = when
        heapq.heappush(self.hearing, Heard(when, agent))

    def deaf(self, now: float) -> None:
        """Nobody could be heard until `now`: every silence starts again then."""
        for m, when in list(self.heard.items()):
            self.hear(m, max(when, now))

    def oldest(self, expects: Callable[[int], bool]) -> float | None:
        """When the agent it `expects` heard longest ago was last heard (None: nobody is
        expected): `min(heard[m] for m expected)` in O(log P) amortized, as it is asked
        after every delivery. Heard times only grow, so an entry older than its agent's
        current time is stale for good; an agent not expected now may be again, so its
        entry is set aside and put back."""
        heap, aside = self.hearing, []
        while heap:
            when, agent = heap[0]
            if self.heard.get(agent) != when:
                heapq.heappop(heap)
            elif expects(agent):
                break
            else:
                aside.append(heapq.heappop(heap))
        oldest = heap[0].when if heap else None
        for entry in aside:
            heapq.heappush(heap, entry)
        return oldest
