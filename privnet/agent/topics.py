"""The MQTT topic layout of a privnet run, and the exact size of a PUBLISH on the wire.

Every topic lives under `privnet/<run>/`, and the agent-to-agent topic names both ends
(`to/<k>/from/<m>`: from sender m to receiver k) so a broker ACL can say "agent m writes only
`from/m` and reads only `to/m`". Pure functions; the launcher, agents and orchestrator share them.
"""

import functools
import re
import socket
from typing import Literal

PREFIX = "privnet"
NODELAY = ((socket.IPPROTO_TCP, socket.TCP_NODELAY, 1),)
"""aiomqtt socket_options for every privnet client: rounds are latency-bound."""
MAX_PACKET_SIZE = (1 << 20) + 4096
"""mosquitto's `max_packet_size`: every packet of at most this many bytes gets through.

It covers the largest message of every plane with its topic and PUBLISH header: a control or
telemetry message (`wire.MAX_CONTROL_BYTES`, 1 MiB) and a peer frame (`wire.MAX_PEER_BYTES`,
one model or one chunk of one); tests/test_chunks.py checks it. (mosquitto compares
remaining length + 1 with it, so packets up to 3 bytes longer may get through too.)"""

_NAME = re.compile(r"[A-Za-z0-9._-]{1,64}")
_PEER = re.compile(rf"{PREFIX}/([A-Za-z0-9._-]{{1,64}})/to/(0|[1-9][0-9]*)/from/(0|[1-9][0-9]*)")
_UP = re.compile(rf"{PREFIX}/([A-Za-z0-9._-]{{1,64}})/(ctl/up|telemetry)/(0|[1-9][0-9]{{0,9}})")
_MAX_REMAINING = 268_435_455  # largest value of the 4-byte remaining-length varint


def _check_name(kind: str, value: str) -> str:
    """Run names and nonces become single topic levels: no '/', '+', '#' or spaces."""
    if not isinstance(value, str) or not _NAME.fullmatch(value):
        raise ValueError(
            f"bad {kind} {value!r}: use 1-64 characters from letters, digits, '.', '_' and '-'"
        )
    return value


def _check_id(value: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"bad agent id {value!r}: agent ids are integers >= 0")
    return value


def _base(run: str) -> str:
    return f"{PREFIX}/{_check_name('run name', run)}"


def run_filter(run: str) -> str:
    """Everything of one run (the auditor's and the orchestrator's subscription)."""
    return f"{_base(run)}/#"


@functools.lru_cache(maxsize=4096, typed=True)  # typed: True is no agent id, though == 1
def peer_topic(run: str, k: int, m: int) -> str:
    """A message from agent m to agent k (cached: an agent sends on the same few links)."""
    return f"{_base(run)}/to/{_check_id(k)}/from/{_check_id(m)}"


@functools.lru_cache(maxsize=4096)
def parse_peer_topic(topic: str) -> tuple[str, int, int] | None:
    """(run, k, m) of an agent-to-agent topic; None for any other topic (cached: an agent
    hears on the same few links)."""
    match = _PEER.fullmatch(topic)
    if match is None:
        return None
    return match.group(1), int(match.group(2)), int(match.group(3))


def inbox_filter(run: str, k: int) -> str:
    """What agent k subscribes to: every message addressed to it."""
    return f"{_base(run)}/to/{_check_id(k)}/from/+"


def ctl_down(run: str, m: int | Literal["all"]) -> str:
    """Orchestrator to agent m, or to every agent with m = "all"."""
    target = "all" if m == "all" else str(_check_id(m))
    return f"{_base(run)}/ctl/down/{target}"


def ctl_up(run: str, m: int) -> str:
    """Agent m to the orchestrator."""
    return f"{_base(run)}/ctl/up/{_check_id(m)}"


def telemetry(run: str, m: int) -> str:
    """Agent m's metrics (sealed to the orchestrator's key when they carry a model)."""
    return f"{_base(run)}/telemetry/{_check_id(m)}"


def up_filters(run: str) -> list[str]:
    """What the orchestrator reads: every agent's upward control and telemetry."""
    return [f"{_base(run)}/ctl/up/+", f"{_base(run)}/telemetry/+"]


def parse_up_topic(topic: str) -> tuple[str, int] | None:
    """(run, agent) of an upward topic (ctl/up/<m> or telemetry/<m>); None otherwise."""
    match = _UP.fullmatch(topic)
    if match is None:
        return None
    return match.group(1), int(match.group(3))


def _varint_len(value: int) -> int:
    """Bytes of MQTT's remaining-length encoding (7 bits per byte)."""
    return 1 if value < 128 else 2 if value < 16_384 else 3 if value < 2_097_152 else 4


def publish_packet(topic: str, payload: bytes | bytearray, size: int | None = None) -> bytes:
    """A QoS-0 PUBLISH, MQTT 3.1.1 (no properties): the bytes amqtt's and gmqtt's builders
    make, at a tenth of their cost (the agents' sends and the embedded broker's copies).
    With `size`, the packet of a payload of `size` bytes without it (its header, which the
    caller writes before the payload: a big payload is not copied)."""
    name = topic.encode()
    size = len(payload) if size is None else size
    remaining, length = 2 + len(name) + size, bytearray()
    while True:
        remaining, digit = remaining >> 7, remaining & 0x7F
        length.append(digit | (0x80 if remaining else 0))
        if not remaining:
            return b"\x30" + length + len(name).to_bytes(2, "big") + name + payload


def mqtt_publish_size(topic: str, payload_len: int, qos: int = 0) -> int:
    """Exact size of an MQTT 3.1.1 PUBLISH packet: what one message costs on the wire.

    fixed header byte + remaining-length varint + 2-byte topic length + topic (UTF-8)
    + 2-byte packet id (QoS 1 and 2 only) + payload.
    """
    if qos not in (0, 1, 2):
        raise ValueError(f"bad qos {qos!r}: MQTT QoS is 0, 1 or 2")
    if payload_len < 0:
        raise ValueError(f"bad payload length {payload_len}: it cannot be negative")
    topic_len = len(topic.encode("utf-8"))
    if topic_len > 65_535:
        raise ValueError(f"topic is {topic_len} bytes long; MQTT allows at most 65535")
    remaining = 2 + topic_len + (2 if qos else 0) + payload_len
    if remaining > _MAX_REMAINING:
        raise ValueError(f"a PUBLISH of {remaining} bytes exceeds MQTT's limit {_MAX_REMAINING}")
    return 1 + _varint_len(remaining) + remaining
