"""One agent's links to its neighbours for one membership view: frames sealed, opened, and
kept in order. Pure: no I/O; the node holds one per view.

Sealed (the default), every peer frame is ChaCha20-Poly1305 under a key only the link's two
ends hold: masks cancel at a hub, so whoever reads every frame into it (the broker) would
add them up, and sealing leaves such an eavesdropper nothing to add. The nonce is the
frame's place on its link (a model's round and step, a key frame's count), known to both
ends, so none is sent and none repeats; a frame not past the last one from its sender is a
`replay`. Visible (`--seal-links off`): the paper's wire, frames MACed, read by anyone.
A model over one frame goes as chunk frames (`wire.chunks`), reassembled here, at most one
model in flight per in-link.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping

from cryptography.hazmat.primitives.ciphers.aead import ChaCha20Poly1305

from privnet.agent import wire
from privnet.agent.messages import Model, Reason, Rejected
from privnet.agent.spec import STEPS
from privnet.agent.wire import chunks


class Links:
    """The codec of `me`'s peer frames in `view`: `encode` for a neighbour, `decode` from one."""

    def __init__(
        self,
        run: str,
        me: int,
        dim: int,
        view: int,
        link_keys: Mapping[int, bytes],
        *,
        sealed: bool = True,
        dtype: str = wire.DTYPE,
    ) -> None:
        self.run, self.me, self.dim, self.view, self.sealed = run, me, dim, view, sealed
        self.dtype = dtype  # a model vector's: <f8, or <u4 (lattice words)
        self.keys = dict(link_keys)  # neighbour -> key (escrowed under --audit)
        self._aead = {m: ChaCha20Poly1305(k) for m, k in self.keys.items()} if sealed else {}
        self._sent: Counter[int] = Counter()  # key frames sent to each neighbour
        self._last: dict[tuple[int, int], tuple[int, int]] = {}  # (sender, kind) -> place
        self.chunked = chunks.needs_chunks(dim, dtype)
        self._chunks = chunks.Reassembler(run, me, dim, dtype) if self.chunked else None

    def frames(self, msg: wire.Peer) -> list[bytes]:
        """`msg` as the frames for its receiver's link: one, or a model's chunks in order."""
        if not (self.chunked and type(msg) is Model):
            return [self.encode(msg)]
        if not self.sealed:
            return chunks.mac_chunks(msg, self.keys[msg.receiver])
        return chunks.seal_chunks(msg, self._aead[msg.receiver], self.run)

    @property
    def held_bytes(self) -> int:
        """The bytes of chunked models in flight held for the in-links (bounded)."""
        return 0 if self._chunks is None else self._chunks.held_bytes

    def encode(self, msg: wire.Peer) -> bytes:
        """`msg` as the one frame for its receiver's link (a chunked model: `frames`)."""
        if not self.sealed:
            return wire.encode_peer(msg, self.keys[msg.receiver])
        seq = 0
        if type(msg) is not Model:
            seq = self._sent[msg.receiver]
            self._sent[msg.receiver] += 1
        return wire.seal_peer(msg, self._aead[msg.receiver], self.run, seq)

    def decode(self, data: bytes, sender: int) -> wire.Peer | None:
        """The message in `data`, which came on `sender`'s topic, None for a chunk that
        leaves its model incomplete, or Rejected: the cheap checks first (shape, view,
        route, order), the seal last."""
        if self._chunks is not None and chunks.is_chunk(data):
            return self._chunk(data, sender)
        if not self.sealed:
            return wire.decode_peer(
                data,
                receiver=self.me,
                topic_sender=sender,
                dim=self.dim,
                link_keys=self.keys,
                view=self.view,
                dtype=self.dtype,
            )
        aead = self._aead.get(sender)
        model = wire.open_model(
            data,
            receiver=self.me,
            topic_sender=sender,
            dim=self.dim,
            view=self.view,
            aead=aead,
            run=self.run,
            after=self._last.get((sender, wire.MODEL_KIND)),
            dtype=self.dtype,
        )
        if model is not None:
            self._last[(sender, wire.MODEL_KIND)] = (model.round, STEPS.index(model.step))
            return model
        head = wire.read_head(data)
        name = head.schema.name
        wire.check_route(name, head.fields, topic_sender=sender, receiver=self.me, view=self.view)
        if aead is None:
            raise Rejected(
                Reason.UNKNOWN_SENDER, f"{name} from agent {sender}, with whom there is no link key"
            )
        slot = (sender, head.kind)
        last = self._last.get(slot)
        if last is not None and head.at <= last:
            raise Rejected(
                Reason.REPLAY, f"{name} from agent {sender} at {head.at}, already past {last} there"
            )
        msg = wire.open_head(head, aead, self.run, self.dim, self.dtype)
        self._last[slot] = head.at  # only an authentic frame moves the link on
        return msg

    def _chunk(self, data: bytes, sender: int) -> Model | None:
        assert self._chunks is not None
        head = chunks.read_chunk(data)
        route = {"topic_sender": sender, "receiver": self.me, "view": self.view}
        wire.check_route("chunk", head.fields, **route)
        secret = self._aead.get(sender) if self.sealed else self.keys.get(sender)
        if secret is None:
            raise Rejected(
                Reason.UNKNOWN_SENDER, f"chunk from agent {sender}, with whom there is no link key"
            )
        slot = (sender, wire.MODEL_KIND)  # a chunked model moves the link as a model frame
        model = self._chunks.take(head, secret, self._last.get(slot))
        if model is not None:
            self._last[slot] = head.place
        return model

    def read(self, data: bytes) -> wire.Peer:
        """A frame of any of these links, in either direction, read as one of its two ends
        can: no order kept (for meters that see what this agent publishes)."""
        if not self.sealed:
            return wire.peek_peer(data, self.dim, dtype=self.dtype)
        head = wire.read_head(data)
        other = head.receiver if head.sender == self.me else head.sender
        aead = self._aead.get(other)
        if aead is None:
            raise Rejected(Reason.UNKNOWN_SENDER, f"no link between agents {self.me} and {other}")
        return wire.open_head(head, aead, self.run, self.dim, self.dtype)
