"""Control frames, signed, and the plaintexts they seal: a Config, Reports, link keys.

A control frame's `mac` slot holds an Ed25519 signature over (type, body), where body wraps
the message with its run name and a sequence number; what determines a model travels sealed
inside (`encode_config`, `encode_reports`, `encode_link_keys`). A checkpoint on disk is an
agent's own Reports with a header.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Annotated

import numpy as np

from privnet.agent import keys
from privnet.agent.control import Config, Control
from privnet.agent.messages import Reason, Rejected, Report
from privnet.agent.spec import AgentId, Count, Size
from privnet.agent.wire.catalog import CONFIG, CONTROL, REPORT, SIGNED, VERSION, Envelope
from privnet.agent.wire.frames import (
    CONTROL_LIMITS,
    MAX_CONTROL_BYTES,
    build,
    frame,
    open_frame,
    pack,
    schema_of,
    unpack,
)
from privnet.agent.wire.schema import encode_fields, kind_of

SIGNATURE_BYTES = 64
SIGN_TAG = b"privnet/control/v1\0"


@dataclass(frozen=True, slots=True)
class SignedFrame:
    """A decoded control frame whose signature is not yet checked: `verify` does that."""

    run: str
    seq: int
    msg: Control
    statement: bytes  # exactly what the signer signed
    signature: bytes

    def verify(self, signer: keys.PublicIdentity, who: str) -> None:
        """Rejected("bad-signature") unless `signer` signed this frame."""
        if not signer.valid(self.signature, self.statement):
            raise Rejected(
                Reason.BAD_SIGNATURE,
                f"{type(self.msg).__name__} is not signed by {who}: forged or altered",
            )


def _statement(name: str, body: bytes) -> bytes:
    return SIGN_TAG + name.encode() + b"\0" + body


def encode_signed(msg: Control, run: str, seq: int, signer: keys.Identity) -> bytes:
    """A control or telemetry message, bound to its run and sequence number, signed."""
    schema = SIGNED[schema_of(msg, CONTROL, "a control frame").name]
    body = pack(encode_fields(Envelope(run, seq, msg), schema.fields))
    return pack([VERSION, schema.name, body, signer.sign(_statement(schema.name, body))])


def decode_signed(data: bytes, max_size: int = MAX_CONTROL_BYTES) -> SignedFrame:
    """The control frame in `data`, schema-checked, or Rejected; the caller verifies it."""
    opened = open_frame(data, max_size, CONTROL_LIMITS, SIGNED, "control message")
    if len(opened.mac) != SIGNATURE_BYTES:
        raise Rejected(
            Reason.BAD_SIGNATURE,
            f"{opened.schema.name}: a control frame carries a {SIGNATURE_BYTES}-byte "
            f"signature, this one {len(opened.mac)} bytes",
        )
    envelope = build(opened, Envelope)
    statement = _statement(opened.schema.name, opened.body)
    return SignedFrame(envelope.run, envelope.seq, envelope.msg, statement, opened.mac)


def encode_config(config: Config) -> bytes:
    """The plaintext that Setup seals."""
    return frame(CONFIG, config, None)


def decode_config(data: bytes) -> Config:
    """The Config inside an opened Setup, or Rejected."""
    opened = open_frame(data, MAX_CONTROL_BYTES, CONTROL_LIMITS, {CONFIG.name: CONFIG}, "config")
    return build(opened, Config)


def encode_report(report: Report) -> bytes:
    """The plaintext that Telemetry seals: the agent's true model for one round."""
    return frame(REPORT, report, None)


def decode_report(data: bytes, dim: int, max_size: int = MAX_CONTROL_BYTES) -> Report:
    """The Report inside an opened Telemetry blob, or Rejected."""
    opened = open_frame(data, max_size, CONTROL_LIMITS, {REPORT.name: REPORT}, "report")
    if opened.mac:
        raise Rejected(Reason.SCHEMA, "report frames carry an empty MAC")
    return build(opened, Report, dim)


REPORT_OVERHEAD = 96  # a report frame's bytes besides its vector's (widest counts: 84)
TELEMETRY_OVERHEAD = 2048  # a Telemetry's bytes besides its reports' (signature, seal, ...)


def reports_per_message(dim: int) -> int:
    """How many Reports of `dim` parameters one Telemetry carries within MAX_CONTROL_BYTES
    (0: not even one; a run with telemetry refuses such a model)."""
    return max(0, (MAX_CONTROL_BYTES - TELEMETRY_OVERHEAD) // (8 * dim + REPORT_OVERHEAD))


def max_report_dim() -> int:
    """The most parameters a model may have for one Telemetry to carry it."""
    return (MAX_CONTROL_BYTES - TELEMETRY_OVERHEAD - REPORT_OVERHEAD) // 8


def encode_reports(reports: list[Report]) -> bytes:
    """A batch of Reports (one sealed Telemetry carries several rounds)."""
    return pack([encode_report(r) for r in reports])


def decode_reports(data: bytes, dim: int, max_size: int = MAX_CONTROL_BYTES) -> list[Report]:
    """The Reports of an opened Telemetry blob, or Rejected."""
    frames = unpack(data, max_size, CONTROL_LIMITS, "report batch")
    if not isinstance(frames, list) or not all(isinstance(f, bytes) for f in frames):
        raise Rejected(Reason.SCHEMA, "a report batch is a list of report frames")
    return [decode_report(f, dim, max_size) for f in frames]


LinkKeys = dict[AgentId, Annotated[bytes, Size(keys.KEY_BYTES)]]
_LINK_KEYS = kind_of(LinkKeys)
_COUNT = kind_of(Count)


def encode_link_keys(link_keys: Mapping[int, bytes]) -> bytes:
    """The plaintext an Escrow seals: neighbour id -> link key."""
    return pack({int(m): bytes(k) for m, k in link_keys.items()})


def decode_link_keys(data: bytes) -> dict[int, bytes]:
    """The link keys in an opened Escrow, or Rejected."""
    got = unpack(data, MAX_CONTROL_BYTES, CONTROL_LIMITS, "escrow")
    link_keys: dict[int, bytes] = _LINK_KEYS.decode(got, "escrow")
    return link_keys


def encode_checkpoint(
    run: str, agent: int, session: int, models: Mapping[int, np.ndarray]
) -> bytes:
    """An agent's own models by round (a checkpoint on disk): its Reports, with a header."""
    reports = [Report(agent, r, w) for r, w in sorted(models.items())]
    dim = len(reports[0].w) if reports else 0
    return pack([VERSION, run, agent, session, dim, encode_reports(reports)])


def decode_checkpoint(data: bytes, where: str) -> tuple[str, int, int, dict[int, np.ndarray]]:
    """(run, agent, session, models) of a checkpoint; ValueError saying what is wrong."""
    limit = MAX_CONTROL_BYTES * 64
    try:
        got = unpack(data, limit, CONTROL_LIMITS, "checkpoint")
        if not isinstance(got, list) or len(got) != 6 or got[0] != VERSION:
            raise Rejected(
                Reason.MALFORMED, "expected [version, run, agent, session, dim, reports]"
            )
        _, run, agent, session, dim, blob = got
        if not (isinstance(run, str) and isinstance(blob, bytes)):
            raise Rejected(Reason.MALFORMED, "run must be text and reports bytes")
        agent, session, dim = (_COUNT.decode(v, "checkpoint") for v in (agent, session, dim))
        reports = decode_reports(blob, dim, limit)
    except Rejected as exc:
        raise ValueError(f"{where} is not a privnet checkpoint: {exc.detail}") from None
    if any(r.sender != agent for r in reports):
        raise ValueError(f"{where} holds models of another agent than {agent}")
    return run, agent, session, {r.round: r.w for r in reports}
