"""One agent's links to its neighbours for one membership view: frames sealed, opened, and
kept in order. Pure: no I/O; the node holds one per view.

Sealed (the default), every peer frame is ChaCha20-Poly1305 under a key only the link's two
ends hold: masks cancel at a hub, so whoever reads every frame into it (the broker) would
add them up, and sealing leaves such an eavesdropper nothing to add. The nonce is the
frame's place on its link (a model's round and step, a key frame's count), known to both
ends, so none is sent and none repeats; a frame not past the last one from its sender is a
`replay`. Visible (`--seal-links off`): the paper's wire, frames MACed, read by anyone.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping

from cryptography.hazmat.primitives.ciphers.aead import ChaCha20Poly1305

from privnet.agent import wire
from privnet.agent.messages import Model, Reason, Rejected
from privnet.agent.spec import STEPS


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
    ) -> None:
        self.run, self.me, self.dim, self.view, self.sealed = run, me, dim, view, sealed
        self.keys = dict(link_keys)  # neighbour -> key (escrowed under --audit)
        self._aead = {m: ChaCha20Poly1305(k) for m, k in self.keys.items()} if sealed else {}
        self._sent: Counter[int] = Counter()  # key frames sent to each neighbour
        self._last: dict[tuple[int, int], tuple[int, int]] = {}  # (sender, kind) -> place

    def encode(self, msg: wire.Peer) -> bytes:
        """`msg` as the frame for its receiver's link."""
        if not self.sealed:
            return wire.encode_peer(msg, self.keys[msg.receiver])
        seq = 0
        if type(msg) is not Model:
            seq = self._sent[msg.receiver]
            self._sent[msg.receiver] += 1
        return wire.seal_peer(msg, self._aead[msg.receiver], self.run, seq)

    def decode(self, data: bytes, sender: int) -> wire.Peer:
        """The message in `data`, which came on `sender`'s topic, or Rejected: the cheap
        checks first (shape, view, route, order), the seal last."""
        if not self.sealed:
            return wire.decode_peer(
                data,
                receiver=self.me,
                topic_sender=sender,
                dim=self.dim,
                link_keys=self.keys,
                view=self.view,
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
        msg = wire.open_head(head, aead, self.run, self.dim)
        self._last[slot] = head.at  # only an authentic frame moves the link on
        return msg

    def read(self, data: bytes) -> wire.Peer:
        """A frame of any of these links, in either direction, read as one of its two ends
        can: no order kept (for meters that see what this agent publishes)."""
        if not self.sealed:
            return wire.peek_peer(data, self.dim)
        head = wire.read_head(data)
        other = head.receiver if head.sender == self.me else head.sender
        aead = self._aead.get(other)
        if aead is None:
            raise Rejected(Reason.UNKNOWN_SENDER, f"no link between agents {self.me} and {other}")
        return wire.open_head(head, aead, self.run, self.dim)
