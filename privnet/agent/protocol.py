"""The protocol's vocabulary, shared by both of its machines: the agent's (`privnet.agent.node`)
and the orchestrator's (`privnet.orchestrator.conductor`).

What a machine returns (`Output`: frames to `Publish`, `Event`s, `Unsubscribe`s, a
`Checkpoint`), what it counts (`Traffic` published, `Deliveries` used or rejected), the QoS
of each plane, the heartbeat rate, and the bytes that bind a proof or a sealed frame to its
place in the run (`hello_proof`, the `*_context` functions). Neither machine owns these:
the conductor reads what the node writes, so both take them from here.
"""

from __future__ import annotations

import hmac
from collections import Counter
from dataclasses import dataclass, field

import numpy as np

from privnet.agent import topics, wire

QOS = 1  # the control plane (control, telemetry): at-least-once; duplicates are dropped
# The peer plane (models, key shares) goes at most once: on a live TCP connection the broker
# loses none, and a lost connection ends the agent anyway (no session resumes), so a PUBACK
# per frame buys nothing but two packets per edge per round. Agents subscribe to their inbox
# at QoS 0 too: a broker that delivers at the subscription's QoS (amqtt) then sends no QoS-1
# copies either. A round whose frames did not all arrive is redone under the next membership
# view (DESIGN: Membership and faults), never repaired by a resend.
PEER_QOS = 0
QOS_OF = {"model": PEER_QOS, "keys": PEER_QOS, "telemetry": QOS, "control": QOS, "audit": QOS}
# An agent's models of rounds not yet recorded, at most about (in bytes, at 8 a parameter):
# its telemetry goes once its unsent rounds' models reach this, and the conductor's Recorded
# once the members' reports free this much (pacing.recorded_step), so a 1M-parameter agent
# holds a few models, not a telemetry batch's (10 rounds: 80 MB), and a small one never waits.
HISTORY_BYTES = 8 << 20
BEATS = 3  # heartbeats (Progress, Beat) per deadline: three missed ones mean gone
# Deadlines an agent waits for a silent orchestrator while its neighbours still speak: their
# frames prove the run goes on, and a busy orchestrator (or a busy machine) beats late.
PATIENCE = 3
HELLO_TAG = b"privnet/hello/v1\0"


def hello_proof(token: bytes, run: str, agent: int, identity: bytes) -> bytes:
    """HMAC over the registration, with the launch token as key."""
    data = HELLO_TAG + f"{run}\0{agent}\0".encode() + identity
    return hmac.new(token, data, "sha256").digest()


def telemetry_context(run: str, agent: int, session: int, view: int, round_: int) -> bytes:
    """Associated data of a sealed report batch: binds it to run, agent, session, view, round."""
    return f"privnet/telemetry/{run}/{agent}/{session}/{view}/{round_}".encode()


def setup_context(run: str, agent: int, session: int, view: int) -> bytes:
    """Associated data of a sealed Config."""
    return f"privnet/setup/{run}/{agent}/{session}/{view}".encode()


def escrow_context(run: str, agent: int, session: int, view: int) -> bytes:
    """Associated data of an agent's escrowed link keys."""
    return f"privnet/escrow/{run}/{agent}/{session}/{view}".encode()


@dataclass(frozen=True)
class Checkpoint:
    """An agent's own models after some rounds of a session: what it restarts from."""

    run: str
    agent: int
    session: int
    models: dict[int, np.ndarray]  # round -> w after it (0: the initial model)

    def to_bytes(self) -> bytes:
        return wire.encode_checkpoint(self.run, self.agent, self.session, self.models)

    @classmethod
    def from_bytes(cls, data: bytes, where: str) -> Checkpoint:
        run, agent, session, models = wire.decode_checkpoint(data, where)
        return cls(run, agent, session, models)


@dataclass(frozen=True, slots=True)
class Publish:
    topic: str
    payload: bytes
    category: str  # model, keys, telemetry, control or audit (escrow): the byte-accounting bucket

    @property
    def qos(self) -> int:
        return QOS_OF.get(self.category, QOS)


@dataclass(frozen=True, slots=True)
class Event:
    """Something the shell may log or act on; `kind` is one of the names below."""

    kind: str  # registered, configured, keyed, started, finished, failed, closed
    detail: str = ""


@dataclass(frozen=True, slots=True)
class Unsubscribe:
    """Stop reading `pattern`; `probe` is a topic the party may both write and read under it,
    with which a shell can tell that everything queued before has been delivered."""

    pattern: str
    probe: str


@dataclass
class Output:
    publish: list[Publish] = field(default_factory=list)
    events: list[Event] = field(default_factory=list)
    unsubscribe: list[Unsubscribe] = field(default_factory=list)  # then `unsubscribed`
    checkpoint: Checkpoint | None = None  # for the shell to save (the latest wins)
    # What else the shell is to do, as data (the orchestrator's `Watch`: write a file, signal
    # a process): the machine decides, its shell does. A tuple: most outputs have none.
    effects: tuple[object, ...] = ()

    def __iadd__(self, other: Output) -> Output:
        self.publish += other.publish
        self.events += other.events
        self.unsubscribe += other.unsubscribe
        self.checkpoint = other.checkpoint or self.checkpoint
        if other.effects:
            self.effects += other.effects
        return self

    def __add__(self, other: Output) -> Output:
        return Output(
            self.publish + other.publish,
            self.events + other.events,
            self.unsubscribe + other.unsubscribe,
            other.checkpoint or self.checkpoint,
            self.effects + other.effects,
        )


@dataclass
class Traffic:
    """MQTT bytes (`octets`: PUBLISH packet sizes) and messages published, by category. The
    results and summary.json still call the octets "bytes"."""

    octets: Counter[str] = field(default_factory=Counter)
    messages: Counter[str] = field(default_factory=Counter)

    def add(self, category: str, topic: str, payload: bytes) -> None:
        self.octets[category] += topics.mqtt_publish_size(
            topic, len(payload), QOS_OF.get(category, QOS)
        )
        self.messages[category] += 1


@dataclass
class Deliveries:
    """Every delivery is either used or rejected under exactly one reason; `kept` are
    those waiting (an agent's peer frames early for their view) to be one or the other."""

    received: int = 0
    used: int = 0
    kept: int = 0
    rejected: Counter[str] = field(default_factory=Counter)


@dataclass
class Counters:
    """What the core did, for metrics and the overhead report."""

    agreements: int = 0  # Diffie-Hellman agreements computed
    relayed: int = 0  # key shares forwarded as a hub
