"""The real cryptography of privnet: identities, signed key shares, masks, link keys, sealing.

Every agent has a long-term Ed25519 identity (signatures) and a static X25519 key (link MAC
keys). For the masked schemes (local-ghp, masked-ghp), each pair at a hub agrees on a secret
through ephemeral X25519 keys that the owners sign, so the relaying hub cannot swap in its
own keys and strip the masks.
Secrets come from OS entropy only; masks come from HKDF + ChaCha20, never from numpy seeds.
Pure functions, no I/O.
"""

from __future__ import annotations

import math
import os
import struct
from dataclasses import dataclass

import numpy as np
from cryptography.exceptions import InvalidSignature, InvalidTag
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric.ed25519 import (
    Ed25519PrivateKey,
    Ed25519PublicKey,
)
from cryptography.hazmat.primitives.asymmetric.x25519 import (
    X25519PrivateKey,
    X25519PublicKey,
)
from cryptography.hazmat.primitives.ciphers import Cipher, CipherContext, algorithms
from cryptography.hazmat.primitives.ciphers.aead import ChaCha20Poly1305
from cryptography.hazmat.primitives.kdf.hkdf import HKDF
from cryptography.hazmat.primitives.serialization import (
    Encoding,
    NoEncryption,
    PrivateFormat,
    PublicFormat,
)

from privnet.agent import rng
from privnet.agent.messages import KeyShare

KEY_BYTES = 32
NONCE_BYTES = 12
TAG_BYTES = 16
SEAL_OVERHEAD = KEY_BYTES + NONCE_BYTES + TAG_BYTES

SHARE_TAG = b"privnet/keyshare/v1"
MASK_TAG = b"privnet/mask/v2"
MASK_WORDS_TAG = b"privnet/mask-u4/v1"  # the u4 wire's masks: another key for other words
LINK_TAG = b"privnet/link/v1"
LINK_SEAL_TAG = b"privnet/link-seal/v1"
SEAL_TAG = b"privnet/seal/v1"

# Fixed-width big-endian fields, so no two different tuples encode to the same bytes.
_SHARE_FIELDS = struct.Struct(">IIIBQ")  # owner, hub, partner, step, epoch
_MASK_FIELDS = struct.Struct(">IIIBQI")  # hub, min(pair), max(pair), step, epoch, dim
_LINK_FIELDS = struct.Struct(">II")  # min(a, b), max(a, b)
_LINK_SEAL_FIELDS = struct.Struct(">IIQ")  # min(a, b), max(a, b), view
_BLOCK = 64  # bytes of one ChaCha20 block
_COUNTER_BLOCKS = 2**32  # ChaCha20's block counter is 32 bits (RFC 8439)
_ZEROS = memoryview(bytes(1 << 18))  # the keystream's input, a piece at a time: stays in cache


class BadKey(ValueError):
    """A signature, key or sealed blob that fails its check; the message says whose and why."""


def public_bytes(key: Ed25519PublicKey | X25519PublicKey) -> bytes:
    """The raw 32 bytes of a public key, as they go on the wire."""
    return key.public_bytes(Encoding.Raw, PublicFormat.Raw)


def _x25519_public(raw: bytes, what: str) -> X25519PublicKey:
    if len(raw) != KEY_BYTES:
        raise BadKey(f"{what}: an X25519 public key is {KEY_BYTES} bytes, got {len(raw)}")
    return X25519PublicKey.from_public_bytes(raw)


def _exchange(private: X25519PrivateKey, peer_public: bytes, what: str) -> bytes:
    peer = _x25519_public(peer_public, what)
    try:
        return private.exchange(peer)
    except ValueError as exc:  # cryptography refuses an all-zero (low-order) shared secret
        raise BadKey(f"{what}: not a usable X25519 key (low-order point): {exc}") from exc


def _hkdf(secret: bytes, salt: bytes | None, info: bytes) -> bytes:
    """HKDF-SHA256 (RFC 5869) to one 32-byte key: the one derivation of every key here."""
    return HKDF(algorithm=hashes.SHA256(), length=KEY_BYTES, salt=salt, info=info).derive(secret)


def _pack(fields: struct.Struct, names: str, *values: int) -> bytes:
    try:
        return fields.pack(*values)
    except struct.error as exc:
        raise ValueError(
            f"({names}) = {values} must be non-negative integers that fit their fixed width "
            f"(agent ids and steps are small, rounds < 2**64): {exc}"
        ) from exc


@dataclass(frozen=True)
class PublicIdentity:
    """What everyone may know about an agent: raw Ed25519 and X25519 public keys."""

    signing: bytes
    static: bytes

    def __post_init__(self) -> None:
        for name, raw in (("signing", self.signing), ("static", self.static)):
            if len(raw) != KEY_BYTES:
                raise BadKey(
                    f"public identity: the {name} key must be {KEY_BYTES} raw bytes, got {len(raw)}"
                )

    def to_bytes(self) -> bytes:
        """64 bytes for the wire: signing key then static key."""
        return self.signing + self.static

    @classmethod
    def from_bytes(cls, data: bytes) -> PublicIdentity:
        if len(data) != 2 * KEY_BYTES:
            raise BadKey(
                f"public identity must be {2 * KEY_BYTES} bytes (signing + static key), "
                f"got {len(data)}"
            )
        return cls(signing=bytes(data[:KEY_BYTES]), static=bytes(data[KEY_BYTES:]))

    def valid(self, signature: bytes, data: bytes) -> bool:
        """Whether `signature` is this identity's Ed25519 signature of `data`."""
        try:
            Ed25519PublicKey.from_public_bytes(self.signing).verify(signature, data)
        except InvalidSignature:
            return False
        return True

    def verify(self, signature: bytes, data: bytes, *, what: str) -> None:
        if not self.valid(signature, data):
            raise BadKey(f"{what}: signature check failed (wrong signer, or the data was altered)")


@dataclass(frozen=True, eq=False)
class Identity:
    """An agent's long-term keys: Ed25519 (signing) + X25519 (static, for link MAC keys)."""

    signing: Ed25519PrivateKey
    static: X25519PrivateKey

    @classmethod
    def generate(cls) -> Identity:
        """Fresh keys from OS entropy."""
        return cls(signing=Ed25519PrivateKey.generate(), static=X25519PrivateKey.generate())

    @property
    def public(self) -> PublicIdentity:
        return PublicIdentity(
            signing=public_bytes(self.signing.public_key()),
            static=public_bytes(self.static.public_key()),
        )

    def sign(self, data: bytes) -> bytes:
        return self.signing.sign(data)

    def private_bytes(self) -> bytes:
        """64 secret bytes (signing then static), for a 0600 file: the orchestrator's key
        when someone else starts the agents (compose)."""
        raw = (Encoding.Raw, PrivateFormat.Raw, NoEncryption())
        return self.signing.private_bytes(*raw) + self.static.private_bytes(*raw)

    @classmethod
    def from_private_bytes(cls, data: bytes) -> Identity:
        if len(data) != 2 * KEY_BYTES:
            raise BadKey(f"a private identity is {2 * KEY_BYTES} bytes, got {len(data)}")
        return cls(
            signing=Ed25519PrivateKey.from_private_bytes(data[:KEY_BYTES]),
            static=X25519PrivateKey.from_private_bytes(data[KEY_BYTES:]),
        )


@dataclass(frozen=True, eq=False)
class Ephemeral:
    """X25519 key pair for one epoch of pair-mask agreements."""

    private: X25519PrivateKey
    public: bytes

    @classmethod
    def generate(cls) -> Ephemeral:
        """A fresh key pair from OS entropy."""
        private = X25519PrivateKey.generate()
        return cls(private=private, public=public_bytes(private.public_key()))

    def agree(self, peer_public: bytes, *, what: str = "peer's ephemeral key") -> bytes:
        """The 32-byte X25519 shared secret with `peer_public`."""
        return _exchange(self.private, peer_public, what)


def share_statement(
    session: bytes, owner: int, hub: int, partner: int, step: int, epoch: int, public: bytes
) -> bytes:
    """The bytes an owner signs for a KeyShare: all of it except the sender/receiver envelope."""
    if len(public) != KEY_BYTES:
        raise BadKey(
            f"key of agent {owner} for agent {partner}: an X25519 public key is "
            f"{KEY_BYTES} bytes, got {len(public)}"
        )
    names = "owner, hub, partner, step, epoch"
    fields = _pack(_SHARE_FIELDS, names, owner, hub, partner, step, epoch)
    # The session has no fixed width, so its length goes first.
    return SHARE_TAG + struct.pack(">I", len(session)) + session + fields + public


def sign_share(
    identity: Identity,
    session: bytes,
    owner: int,
    hub: int,
    partner: int,
    step: int,
    epoch: int,
    eph: Ephemeral,
) -> bytes:
    """The owner's signature over its ephemeral key for `partner`, relayed by `hub`."""
    return identity.sign(share_statement(session, owner, hub, partner, step, epoch, eph.public))


def verify_share(owner_identity: PublicIdentity, share: KeyShare, session: bytes) -> None:
    """Reject a share whose key, route or signature is not what its owner sent."""
    who = f"key of agent {share.owner} relayed by hub {share.hub} for agent {share.partner}"
    if share.owner == share.partner:
        raise BadKey(f"{who}: owner and partner must be two different agents")
    # A hub with a single other neighbour pairs with it itself (hub == owner or partner):
    # then the share travels one direct leg.
    legs = {(share.owner, share.hub), (share.hub, share.partner)}
    if (share.sender, share.receiver) not in legs:
        raise BadKey(
            f"{who} arrived on the link {share.sender} -> {share.receiver}; it may only travel "
            f"{share.owner} -> {share.hub} -> {share.partner} (redirected share)"
        )
    statement = share_statement(
        session, share.owner, share.hub, share.partner, share.step, share.epoch, share.public
    )
    if not owner_identity.valid(share.signature, statement):
        raise BadKey(f"{who} failed its signature check: the hub or the wire altered it")


class PairStream:
    """The keystream behind the masks g_{lm,k,i} of one pair at one hub, step and key epoch,
    read round by round: both partners derive it alike, for every round of the epoch.

    Derivation. K = HKDF-SHA256(secret, salt=session, info=MASK_TAG || hub || min(pair) ||
    max(pair) || step || epoch || dim) (fixed-width fields), once per stream. Round i's mask
    is the 8 * dim bytes at byte offset i * 8 * dim of the ChaCha20 keystream of K, i.e.
    block index n = offset // 64, which goes into the 16-byte counter||nonce of
    `cryptography`'s ChaCha20 as counter = n mod 2^32 (little-endian) and nonce = n >> 32
    (96 bits, little-endian): a 128-bit block index, so any round < 2^64 has its place.

    Why this is as safe as a fresh key per round:
    - Each mask byte is used once. Rounds occupy disjoint byte ranges of the stream, and a
      stream belongs to one (secret, session, hub, pair, step, epoch, dim): two different
      masks never share a byte, so no two released values carry the same mask. (The pair's
      two partners add the same mask with opposite signs: that is the cancellation.)
    - No (key, nonce, counter) is ever reused: K is unique per stream (the HKDF info holds
      every field that tells streams apart; the secret is fresh per epoch), and within K
      each block index n has exactly one (counter, nonce). The library never carries the
      counter into the nonce here: a read that reaches a 2^32-block boundary is split, and
      the rest comes from a new encryptor at nonce + 1, counter 0.
    - Forward secrecy is unchanged: with `rekey every-round` the epoch is the round, so a
      stream serves one round and is dropped with that epoch's secret (the core forgets
      both). With `rekey once` the session's DH secrets live for the whole session anyway;
      K and the open encryptor are derived from them and forgotten with them.
    - A redone round under a new membership view runs under a new session id: new keys.

    Speed: the core keeps one stream per (epoch, hub, step, partner) and reads rounds in
    order, so a round costs one `update` of 8 * dim bytes, not an HKDF and a cipher setup.
    Reading any other round seeks (a new encryptor at that block), with the same bytes.
    A stream keeps K and its encryptor, and reads only what it is asked for (`MaskBank`
    asks for several rounds at once).
    """

    __slots__ = ("_at", "_encryptor", "_key", "_left", "_width")

    def __init__(
        self,
        secret: bytes,
        session: bytes,
        hub: int,
        pair: tuple[int, int],
        step: int,
        epoch: int,
        dim: int,
        word: int = 8,
    ) -> None:
        """`word`: keystream bytes a parameter, 8 (Laplace masks) or 4 (u4 words, under
        their own tag: the two never share a key)."""
        first, second = sorted(pair)
        if first == second:
            raise ValueError(f"pair {pair} at hub {hub}: a mask needs two different agents")
        if dim < 1:
            raise ValueError(f"dim must be >= 1, got {dim}")
        names = "hub, min(pair), max(pair), step, epoch, dim"
        fields = _pack(_MASK_FIELDS, names, hub, first, second, step, epoch, dim)
        if word not in (4, 8):
            raise ValueError(f"a mask word is 4 or 8 bytes, got {word}")
        self._key = _hkdf(secret, session, (MASK_TAG if word == 8 else MASK_WORDS_TAG) + fields)
        self._width = word * dim
        self._encryptor: CipherContext | None = None
        self._at = -1  # byte offset the open encryptor reads next
        self._left = 0  # bytes it may read before the next 2^32-block boundary

    def read(self, round_: int, rounds: int = 1) -> bytes:
        """The word * dim keystream bytes of round `round_` (of `rounds` rounds from it on)."""
        out = bytearray(rounds * self._width)
        self.read_into(round_, memoryview(out), rounds)
        return bytes(out)

    def read_into(self, round_: int, buf: memoryview, rounds: int = 1, at: int = 0) -> None:
        """`read`'s bytes into `buf` (writable, bytes), from byte `at` of the round on, as
        many as buf holds: no input or output allocated, which at a million parameters cost
        several times the cipher itself. Pieces of a round read in order need no seek."""
        if not (round_ >= 0 and rounds >= 1 and round_ + rounds <= 2**64):
            raise ValueError(
                f"rounds {round_} .. {round_} + {rounds} - 1 must be non-negative and < 2**64"
            )
        n = len(buf)
        if not 0 <= at <= at + n <= rounds * self._width:
            raise ValueError(f"bytes {at}..{at + n} are not within {rounds} round(s) of the stream")
        start = round_ * self._width + at
        encryptor = self._encryptor
        if encryptor is None or start != self._at:
            encryptor = self._seek(start)
        done = 0
        while done < n:  # a piece of _ZEROS at a time; past a 2^32-block boundary, next nonce
            if not self._left:
                encryptor = self._seek(self._at)
            take = min(n - done, self._left, len(_ZEROS))
            encryptor.update_into(_ZEROS[:take], buf[done : done + take])
            self._at, self._left, done = self._at + take, self._left - take, done + take

    def _seek(self, offset: int) -> CipherContext:
        block, skip = divmod(offset, _BLOCK)
        nonce, counter = divmod(block, _COUNTER_BLOCKS)
        iv = counter.to_bytes(4, "little") + nonce.to_bytes(12, "little")
        encryptor = Cipher(algorithms.ChaCha20(self._key, iv), mode=None).encryptor()
        encryptor.update(bytes(skip))
        self._encryptor = encryptor
        self._at, self._left = offset, (_COUNTER_BLOCKS - counter) * _BLOCK - skip
        return encryptor


def stream_laplace(streams: bytes | bytearray, dim: int, sigma_g: float) -> np.ndarray:
    """Laplace masks, one row of `dim` per pair, from concatenated `PairStream` reads.

    One vectorized mapping for all of a step's pairs: per pair it costs more than the
    cryptography does."""
    if not (sigma_g >= 0 and math.isfinite(sigma_g)):
        raise ValueError(f"sigma_g must be >= 0, got {sigma_g}")
    raw = np.frombuffer(streams, dtype="<u8").reshape(-1, dim)
    return rng.laplace(rng.uniforms(raw), sigma_g)


class MaskBank:
    """Fixed linear combinations of pair masks, round by round: row h of round i is
    sum_p coeffs[h, p] * g_p,i, with g_p,i the Laplace mask of round i from `streams[p]`.

    The core's masks at a step are such combinations (the side, +1 or -1, of each pair it
    sits in at each hub), the same every round of an epoch, so the bank reads `ahead`
    rounds of every stream at once and maps and combines them in a few numpy operations:
    a round then costs an index, not a cipher call and a dozen small numpy calls per pair.

    Reading ahead changes nothing the `PairStream` argument rests on: round i still takes
    exactly its own bytes of each stream. The rounds read ahead are never past `last`, the
    epoch's last round (so with every-round re-keying a bank serves its one round), and
    they are derived from the very keys the process holds until then anyway. The buffer
    is bounded: `ahead` shrinks so that it holds at most BUDGET keystream bytes.
    """

    BUDGET = 1 << 16  # keystream bytes read ahead, at most (at least one round)

    __slots__ = ("_ahead", "_buffer", "_coeffs", "_dim", "_first", "_sigma_g", "_streams")

    def __init__(
        self,
        streams: list[PairStream],
        coeffs: np.ndarray,
        dim: int,
        sigma_g: float,
        ahead: int = 64,
    ) -> None:
        if coeffs.ndim != 2 or coeffs.shape[1] != len(streams):
            raise ValueError(
                f"coeffs of shape {coeffs.shape} for {len(streams)} streams: expected "
                "(rows, streams)"
            )
        if ahead < 1:
            raise ValueError(f"ahead must be >= 1, got {ahead}")
        self._streams, self._coeffs = streams, np.array(coeffs, dtype=np.float64)
        self._dim, self._sigma_g = dim, sigma_g
        self._ahead = max(1, min(ahead, self.BUDGET // (8 * dim * max(1, len(streams)))))
        self._first = -1
        self._buffer = np.empty((0, len(coeffs), dim))

    def at(self, round_: int, last: int) -> np.ndarray:
        """Shape (rows, dim): the combinations of round `round_`; `last` (>= round_) is the
        last round these streams may serve (the epoch's)."""
        if not 0 <= round_ - self._first < len(self._buffer):
            if last < round_:
                raise ValueError(f"round {round_} is past the epoch's last round {last}")
            n = min(self._ahead, last - round_ + 1)
            width = n * 8 * self._dim
            raw = bytearray(len(self._streams) * width)
            for p, stream in enumerate(self._streams):
                stream.read_into(round_, memoryview(raw)[p * width : (p + 1) * width], n)
            noise = stream_laplace(raw, self._dim, self._sigma_g)
            by_round = noise.reshape(len(self._streams), n, self._dim).transpose(1, 0, 2)
            self._buffer, self._first = self._coeffs @ by_round, round_
        combined: np.ndarray = self._buffer[round_ - self._first]
        return combined


class WordBank:
    """MaskBank's twin for the u4 wire: row h of round i is sum_p coeffs[h, p] * u_p,i mod
    2^32, u_p,i the 4 * dim keystream bytes of round i of `streams[p]` read as <u4: masks
    uniform on Z_2^32, which need no mapping (one frombuffer a pair), so a 1M-parameter step
    costs one keystream read and one vectorized add per pair. They cancel exactly in the
    hub's sum mod 2^32 (lattice.total). A pair sits at one hub, so each column of `coeffs`
    holds one +1 or -1 (zeros elsewhere)."""

    __slots__ = ("_dim", "_piece", "_places", "_rows", "_streams")
    PIECE = 1 << 16  # words a second pair of a row is read and added in at a time (256 kB)

    def __init__(self, streams: list[PairStream], coeffs: np.ndarray, dim: int) -> None:
        if coeffs.ndim != 2 or coeffs.shape[1] != len(streams):
            raise ValueError(
                f"coeffs of shape {coeffs.shape} for {len(streams)} streams: expected "
                "(rows, streams)"
            )
        if not np.isin(coeffs, (-1, 0, 1)).all():
            raise ValueError("a word bank's coefficients are -1, 0 or +1 (a pair's side)")
        self._streams, self._dim, self._rows = streams, dim, len(coeffs)
        self._piece = np.empty(min(dim, self.PIECE), dtype="<u4")
        if (np.count_nonzero(coeffs, axis=0) != 1).any():
            raise ValueError("each column of a word bank's coefficients has one +1 or -1")
        rows = np.abs(coeffs).argmax(axis=0)  # each stream's one row (checked above)
        self._places = [(int(h), bool(coeffs[h, p] > 0)) for p, h in enumerate(rows)]

    def at(self, round_: int, last: int) -> np.ndarray:
        """Shape (rows, dim), uint32: the combinations of round `round_` (`last`, the
        epoch's last round, as MaskBank.at). A row's first pair is read straight into it
        (negated in place if its side is -1), the others through a small reused piece."""
        if last < round_:
            raise ValueError(f"round {round_} is past the epoch's last round {last}")
        out = np.empty((self._rows, self._dim), dtype="<u4")
        fresh = [True] * self._rows
        for stream, (h, plus) in zip(self._streams, self._places, strict=True):
            if fresh[h]:
                stream.read_into(round_, _bytes(out[h]))
                if not plus:
                    np.negative(out[h], out=out[h])  # mod 2^32
                fresh[h] = False
                continue
            op = np.add if plus else np.subtract
            for at in range(0, self._dim, self.PIECE):
                end = min(at + self.PIECE, self._dim)
                u = self._piece[: end - at]
                stream.read_into(round_, _bytes(u), at=4 * at)
                op(out[h, at:end], u, out=out[h, at:end])
        for row, unmasked in enumerate(fresh):  # a row no pair masks (a self-term, no seat)
            if unmasked:
                out[row] = 0
        return out


def _bytes(words: np.ndarray) -> memoryview:
    """A contiguous array's memory as writable bytes."""
    return memoryview(words.data).cast("B")


def mask_bank(
    streams: list[PairStream], coeffs: np.ndarray, dim: int, sigma_g: float, words: bool
) -> MaskBank | WordBank:
    """The bank of a step's masks: u4 words mod 2^32 (`words`), else Laplace on the grid."""
    return WordBank(streams, coeffs, dim) if words else MaskBank(streams, coeffs, dim, sigma_g)


def link_key(
    me: Identity, peer: PublicIdentity, session: bytes, a: int, b: int, *, view: int | None = None
) -> bytes:
    """The 32-byte key of the link a <-> b; both ends derive the same one.

    With `view`, the key that seals the link's frames (ChaCha20-Poly1305, `links.Links`):
    its own tag and the view in the HKDF info, so no seal key is a MAC key, and none
    outlives a membership change even where the session id would not change. Without, the
    MAC key of the visible wire (`--seal-links off`). Both come from the two ends' static
    X25519 keys, which are fresh per process and never leave it: a link key is known to
    its two ends only, and it is not the mask keys' (those come from ephemeral keys)."""
    if a == b:
        raise ValueError(f"a link joins two different agents, got {a} and {b}")
    shared = _exchange(me.static, peer.static, f"peer's static key on link {a} <-> {b}")
    if view is None:
        return _hkdf(shared, session, LINK_TAG + _pack(_LINK_FIELDS, "a, b", min(a, b), max(a, b)))
    fields = _pack(_LINK_SEAL_FIELDS, "a, b, view", min(a, b), max(a, b), view)
    return _hkdf(shared, session, LINK_SEAL_TAG + fields)


def seal(recipient_static_public: bytes, plaintext: bytes, context: bytes) -> bytes:
    """Anonymous sealed box: eph_pub(32) + nonce(12) + ChaCha20-Poly1305 ciphertext."""
    eph = Ephemeral.generate()
    shared = eph.agree(recipient_static_public, what="recipient's static key for sealing")
    key = _hkdf(shared, None, SEAL_TAG + eph.public + recipient_static_public)
    nonce = os.urandom(NONCE_BYTES)
    return eph.public + nonce + ChaCha20Poly1305(key).encrypt(nonce, plaintext, context)


def open_sealed(recipient: X25519PrivateKey, blob: bytes, context: bytes) -> bytes:
    """Open a `seal` blob; BadKey if it was altered, sealed to another key or another context."""
    if len(blob) < SEAL_OVERHEAD:
        raise BadKey(
            f"sealed blob is {len(blob)} bytes, shorter than the {SEAL_OVERHEAD}-byte minimum "
            "(key + nonce + tag): truncated or not a sealed blob"
        )
    eph_public = blob[:KEY_BYTES]
    nonce = blob[KEY_BYTES : KEY_BYTES + NONCE_BYTES]
    shared = _exchange(recipient, eph_public, "sealed blob's ephemeral key")
    recipient_public = public_bytes(recipient.public_key())
    key = _hkdf(shared, None, SEAL_TAG + eph_public + recipient_public)
    try:
        return ChaCha20Poly1305(key).decrypt(nonce, blob[KEY_BYTES + NONCE_BYTES :], context)
    except InvalidTag as exc:
        raise BadKey(
            "sealed blob failed authentication: it was altered, sealed to another key, "
            "or opened with the wrong context"
        ) from exc
