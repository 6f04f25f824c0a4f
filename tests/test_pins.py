"""Bytes pinned before the wire codec and key derivations were re-cut: the same inputs must
derive the same keys and encode to the same frames, byte for byte (the wire's format is
versioned; a change here is a new VERSION, not a refactor)."""

from __future__ import annotations

import hashlib

import numpy as np
import test_wire
from cryptography.hazmat.primitives.ciphers.aead import ChaCha20Poly1305

from privnet.agent import keys, wire
from privnet.agent.control import Finished, Progress
from privnet.agent.messages import KeyPlan, Model, Report
from privnet.agent.wire import chunks

A = keys.Identity.from_private_bytes(bytes(range(64)))
B = keys.Identity.from_private_bytes(bytes(range(64, 128)))
SESSION = bytes(range(16))
KEY = bytes(range(32))
MODEL = Model(3, 5, 7, 0, np.array([0.25, -1.5]), 1)
PLAN = KeyPlan(3, 5, 1, -1, (2, 4))


def test_link_keys_derive_the_pinned_bytes() -> None:
    """HKDF with the session as salt: the MAC key and the seal key of a link."""
    mac = "15d45ad10f93861aebcdbd69ed4e3ad213e200a6b0045e25ec419a07fa09749e"
    seal = "d9556aa1b4e8c8d0c3b0a6fab9cd22cca5e5d96aca0abb776f32afab6988ba96"
    assert keys.link_key(A, B.public, SESSION, 3, 5).hex() == mac
    assert keys.link_key(B, A.public, SESSION, 5, 3, view=2).hex() == seal


def test_pair_stream_derives_the_pinned_bytes() -> None:
    """HKDF per pair stream (the masks' key), then ChaCha20."""
    stream = keys.PairStream(bytes(range(32)), SESSION, 5, (3, 7), 2, 4, 2).read(3)
    assert stream.hex() == "b769055f62898b197b4596da1e571b9d"


SEALED_BLOB = bytes.fromhex(
    "248b4a13e60b68d6f3099d9e76d661fe9c1fa7ac4da3ad1fe522b36bd7c3f73e7f529130ce7cd8555681df"
    "50e7ab4515273edad8c664b951832ca6f2d4e748a136eb491822088870d703ff0a"
)


def test_a_pinned_sealed_box_still_opens() -> None:
    """HKDF without salt (the sealed boxes of Setup, Telemetry, Escrow): a blob sealed
    before the re-cut opens to its plaintext."""
    assert keys.open_sealed(B.static, SEALED_BLOB, b"ctx") == b"pinned plaintext"


def test_peer_frames_are_the_pinned_bytes() -> None:
    """MACed (HMAC-SHA256, truncated) and sealed frames of a model and a key plan."""
    aead = ChaCha20Poly1305(KEY)
    assert wire.encode_peer(MODEL, KEY).hex() == (
        "9403a56d6f64656cc43c86a17303a17205a16907a16a00a17783a56474797065a33c6638a57368617065"
        "9102a464617461c410000000000000d03f000000000000f8bfa17601c41066ae5c39acd406e1f52fa5e8"
        "b677b02b"
    )
    assert wire.encode_peer(PLAN, KEY).hex() == (
        "9403a76b6579706c616ec41586a17303a17205a16a01a164ffa170920204a17600c410386d144868c731"
        "4a53d8f18e3db00e46"
    )
    assert wire.seal_peer(MODEL, aead, "run").hex() == (
        "9403a56d6f64656cc41085a17303a17205a16907a16a00a17601c43dae444ae3c59668d2af91ae455b20"
        "3685ccf9ebd4a66e02db9fd82e1a337df5e980e709c99a2dd7da2affbe6e19f4f5deb9823a55cd4c1751"
        "b9fad727c5"
    )
    assert wire.seal_peer(PLAN, aead, "run", 4).hex() == (
        "9403a76b6579706c616ec40d84a17303a17205a17600a16e04c41c1c5403b8e3b2182dd2fb4890ddbc33"
        "fd84e7a9393a47aa0ebb906473"
    )


def digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def test_control_frames_and_blobs_are_the_pinned_bytes() -> None:
    """Signed control frames (Ed25519 is deterministic), a Config, reports, a checkpoint and
    an escrow's plaintext."""
    progress = wire.encode_signed(Progress(5, 2, 3, 41, True, (1, 7)), "run", 9, A)
    assert progress.hex() == (
        "9403a870726f6772657373c44183a372756ea372756ea373657109a36d736786a56167656e7405a77365"
        "7373696f6e02a47669657703a5726f756e6429a468656c64c3a777616974696e67920107c440e64e5383"
        "0c7478bf4cd8e8cdffb73bbee24421ce1d94c3884cda449618f967dc31a0f3a4d0a1b16f070c113a9a0a"
        "ac1d462ccf3f543a1215e761ffdce0190609"
    )
    finished = Finished(1, 2, 3, {"stale": 2}, {"model": 99}, {"model": 3}, 1.5)
    assert digest(wire.encode_signed(finished, "run", 9, A)) == (
        "07292ca8ce7343d00ebdf20c556b4b17788b350d9cb86a93f39fd5ce004dc62c"
    )
    assert digest(wire.encode_config(test_wire.config())) == (
        # a Config carries spec.schedule (issue 31: None for a static topology),
        # models_every (issue 29) and spec.attack and spec.defense (issue 34)
        "b5ab4d5881ad75c542e38bfdf3d5b0a99fed1c2a0137f21eeb01269130babb87"
    )
    reports = wire.encode_reports([Report(5, 3, np.array([1.0, -0.0]))])
    assert digest(reports) == "8d989ae6d75a815d176b5a1bc9434cb75575c07f4fc4317b295d3e0eb9b33e5b"
    checkpoint = wire.encode_checkpoint("run", 5, 2, {3: np.array([1.0, 2.0])})
    assert digest(checkpoint) == "5e19b0339b67869f9388a859470717df99f4d1be9ad44db93aa9e289fb884e24"
    assert wire.encode_link_keys({3: bytes(32)}) == b"\x81\x03\xc4\x20" + bytes(32)


WORDS = Model(3, 5, 7, 0, np.array([1, 2**32 - 3], dtype=np.uint32), 1)  # k = 1, -3


def test_u4_frames_are_the_pinned_bytes() -> None:
    """The u4 wire form (`--wire-dtype u4`, privnet.agent.lattice), pinned when it was cut:
    `{"dtype": "<u4", ...}` in a model frame, `d: "<u4"` in a chunk's head, and the u4 masks'
    own pair-stream key (privnet/mask-u4/v1)."""
    assert wire.encode_peer(WORDS, KEY).hex() == (
        "9403a56d6f64656cc43486a17303a17205a16907a16a00a17783a56474797065a33c7534a573686170"
        "659102a464617461c40801000000fdffffffa17601c410dc6562f55fc828e0becc713026abfd3a"
    )
    assert wire.seal_peer(WORDS, ChaCha20Poly1305(KEY), "run").hex() == (
        "9403a56d6f64656cc41085a17303a17205a16907a16a00a17601c435ae444ae3c59668d2af91ae4548"
        "2c3685ccf9ebd4a66e02db9fd82e1a2b7cf5e9801af6e65a556f51c88e3ef999675ea2836fad9076"
    )
    big = Model(3, 5, 7, 0, np.arange(20_000, dtype=np.uint32), 1)
    sealed = chunks.seal_chunks(big, ChaCha20Poly1305(KEY), "run")
    visible = chunks.mac_chunks(big, KEY)
    assert digest(b"".join(sealed)) == (
        "ac12e07f9c91afa182a5b82ef01df4d269aae211547446325529c4ac882297a8"
    )
    assert digest(b"".join(visible)) == (
        "bdb88bb4efb2f443ea362c5519c5cb174d3b702b45211847228e8726c6d86137"
    )
    stream = keys.PairStream(bytes(range(32)), SESSION, 5, (3, 7), 2, 4, 2, 4).read(3)
    assert stream.hex() == "68cf544f665db3e9"
