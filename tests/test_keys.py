"""Keys, signed shares, pair masks, link keys and sealing (privnet/agent/keys.py), and the Laplace
sampler they share with the public noise streams (privnet/agent/rng.py)."""

from __future__ import annotations

import dataclasses
import hashlib
import hmac
import math
import struct

import numpy as np
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey
from hypothesis import given, settings
from hypothesis import strategies as st
from probes import pair_noise
from scipy import stats

from privnet.agent import keys, rng
from privnet.agent.keys import (
    SEAL_OVERHEAD,
    BadKey,
    Ephemeral,
    Identity,
    PublicIdentity,
    link_key,
    open_sealed,
    public_bytes,
    seal,
    share_statement,
    sign_share,
    stream_laplace,
    verify_share,
)
from privnet.agent.messages import KeyShare

SESSION = b"session-0123456789abcdef"
SIGMA_G = 0.1
KS_SAMPLES = 5000
KS_P_MIN = 1e-6
# Sample variance of n Laplace draws has relative std sqrt(5/n) (kurtosis 6): 0.032 at
# n = 5000, so 15% is ~4.7 standard deviations.
VAR_REL_TOL = 0.15

# X25519 points of small order (and non-canonical encodings of them): all give a zero secret.
LOW_ORDER = [
    bytes(32),
    (1).to_bytes(32, "little"),
    bytes.fromhex("e0eb7a7c3b41b8ae1656e3faf19fc46ada098deb9c32b1fd866205165f49b800"),
    bytes.fromhex("5f9c95bca3508c24b1d0b1559c83ef5b04445cc4581c8e86d8224eddd09f1157"),
    (2**255 - 20).to_bytes(32, "little"),
    (2**255 - 19).to_bytes(32, "little"),
    (2**255 - 18).to_bytes(32, "little"),
]

seeds = st.binary(min_size=32, max_size=32)
agent_ids = st.integers(min_value=0, max_value=2**32 - 1)


def identity(seed: int) -> Identity:
    """A deterministic identity, so tests do not depend on OS entropy."""
    signing = hashlib.sha256(b"sign" + bytes([seed])).digest()
    static = hashlib.sha256(b"static" + bytes([seed])).digest()
    return Identity(
        signing=Ed25519PrivateKey.from_private_bytes(signing),
        static=X25519PrivateKey.from_private_bytes(static),
    )


def ephemeral(seed: int) -> Ephemeral:
    private = X25519PrivateKey.from_private_bytes(hashlib.sha256(b"eph" + bytes([seed])).digest())
    return Ephemeral(private=private, public=public_bytes(private.public_key()))


# --- pair masks -------------------------------------------------------------------------


@settings(max_examples=50, deadline=None)
@given(
    secret=seeds,
    session=st.binary(min_size=0, max_size=40),
    hub=agent_ids,
    pair=st.tuples(agent_ids, agent_ids).filter(lambda p: p[0] != p[1]),
    round_=st.integers(min_value=0, max_value=2**64 - 1),
    step=st.sampled_from([0, 1, 2]),
    dim=st.integers(min_value=1, max_value=9),
    epoch=st.integers(min_value=0, max_value=2**64 - 1),
)
def test_both_partners_derive_the_same_noise(secret, session, hub, pair, round_, step, dim, epoch):
    first, second = pair
    args = (secret, session, hub)
    g_first = pair_noise(*args, (first, second), round_, step, dim, SIGMA_G, epoch=epoch)
    g_second = pair_noise(*args, (second, first), round_, step, dim, SIGMA_G, epoch=epoch)
    assert g_first.shape == (dim,)
    np.testing.assert_array_equal(g_first, g_second)


BASE = dict(
    secret=bytes(range(32)),
    session=SESSION,
    hub=5,
    pair=(3, 7),
    round_=11,
    step=0,
    dim=8,
    sigma_g=SIGMA_G,
    epoch=0,
)


@pytest.mark.parametrize(
    "change",
    [
        {"round_": 12},
        {"hub": 6},
        {"pair": (3, 8)},
        {"pair": (2, 7)},
        {"step": 1},
        {"epoch": 1},
        {"session": b"session-other"},
        {"secret": bytes(range(1, 33))},
    ],
    ids=lambda c: next(iter(c)),
)
def test_noise_differs_across_contexts(change):
    base = pair_noise(**BASE)
    other = pair_noise(**(BASE | change))
    assert np.all(base != other), f"noise repeated after changing {change}"


def _chacha20_block(key: bytes, counter: int, nonce: bytes) -> bytes:
    """RFC 8439 section 2.3, written out so the test does not trust the library's framing."""

    def rotl(x: int, n: int) -> int:
        return ((x << n) & 0xFFFFFFFF) | (x >> (32 - n))

    def quarter(s: list[int], a: int, b: int, c: int, d: int) -> None:
        s[a] = (s[a] + s[b]) & 0xFFFFFFFF
        s[d] = rotl(s[d] ^ s[a], 16)
        s[c] = (s[c] + s[d]) & 0xFFFFFFFF
        s[b] = rotl(s[b] ^ s[c], 12)
        s[a] = (s[a] + s[b]) & 0xFFFFFFFF
        s[d] = rotl(s[d] ^ s[a], 8)
        s[c] = (s[c] + s[d]) & 0xFFFFFFFF
        s[b] = rotl(s[b] ^ s[c], 7)

    constants = (0x61707865, 0x3320646E, 0x79622D32, 0x6B206574)
    init = [*constants, *struct.unpack("<8I", key), counter, *struct.unpack("<3I", nonce)]
    s = list(init)
    for _ in range(10):
        for a, b, c, d in ((0, 4, 8, 12), (1, 5, 9, 13), (2, 6, 10, 14), (3, 7, 11, 15)):
            quarter(s, a, b, c, d)
        for a, b, c, d in ((0, 5, 10, 15), (1, 6, 11, 12), (2, 7, 8, 13), (3, 4, 9, 14)):
            quarter(s, a, b, c, d)
    return struct.pack("<16I", *((x + y) & 0xFFFFFFFF for x, y in zip(s, init, strict=True)))


def _stream_key(secret: bytes, hub: int, pair: tuple[int, int], step: int, epoch: int, dim: int):
    """HKDF (RFC 5869 via hmac) of the documented info fields."""
    info = b"privnet/mask/v2" + struct.pack(">IIIBQI", hub, *sorted(pair), step, epoch, dim)
    prk = hmac.digest(SESSION, secret, "sha256")
    return hmac.digest(prk, info + b"\x01", "sha256")


def _keystream(key: bytes, offset: int, length: int) -> bytes:
    """Bytes offset .. offset+length of the documented layout: block n at counter n mod 2^32,
    nonce n >> 32 (96 bits, little-endian)."""
    first, last = offset // 64, (offset + length - 1) // 64
    blocks = b"".join(
        _chacha20_block(key, n % 2**32, (n >> 32).to_bytes(12, "little"))
        for n in range(first, last + 1)
    )
    return blocks[offset - 64 * first :][:length]


def test_noise_follows_the_documented_derivation():
    """HKDF once per (hub, pair, step, epoch, dim) -> ChaCha20, round i at byte offset
    i * 8 * dim -> uniforms -> Laplace."""
    secret, hub, round_, step, epoch, dim = bytes(range(32)), 5, 11, 2, 3, 8
    key = _stream_key(secret, hub, (3, 7), step, epoch, dim)
    stream = _keystream(key, round_ * 8 * dim, 8 * dim)
    raw = np.frombuffer(stream, dtype="<u8")
    expected = rng.laplace(rng.uniforms(raw), SIGMA_G)
    got = pair_noise(secret, SESSION, hub, (7, 3), round_, step, dim, SIGMA_G, epoch=epoch)
    np.testing.assert_array_equal(got, expected)


@pytest.mark.parametrize("dim", [1, 3, 8, 9])
def test_rounds_read_in_order_are_consecutive_disjoint_slices_of_one_keystream(dim):
    """Each mask byte is used once: round i owns bytes [i, i + 1) * 8 * dim of the stream,
    whether read in order (the open encryptor) or out of order (a seek)."""
    secret = hashlib.sha256(b"order").digest()
    key = _stream_key(secret, 4, (1, 2), 0, 0, dim)
    whole = _keystream(key, 0, 8 * dim * 20)
    stream = keys.PairStream(secret, SESSION, 4, (2, 1), 0, 0, dim)
    in_order = b"".join(stream.read(r) for r in range(20))
    assert in_order == whole
    for r in (7, 3, 3, 19, 0, 12, 13):  # seeks, repeats and in-order reads, mixed
        assert stream.read(r) == whole[8 * dim * r : 8 * dim * (r + 1)]
    assert stream.read(5, 9) == whole[8 * dim * 5 : 8 * dim * 14]  # several rounds at once
    piece = bytearray(3)  # pieces of a round, in order and not: the same bytes
    for r, at in ((6, 0), (6, 3), (6, 8 * dim - 3), (2, 1)):
        if at + 3 <= 8 * dim:
            stream.read_into(r, memoryview(piece), at=at)
            assert piece == whole[8 * dim * r + at : 8 * dim * r + at + 3]
    with pytest.raises(ValueError, match="not within"):
        stream.read_into(0, memoryview(bytearray(8 * dim + 1)))


@pytest.mark.parametrize("dim", [1, 5])
def test_a_read_across_a_2_32_block_boundary_goes_on_at_the_next_nonce(dim):
    """The counter is 32 bits: past block 2^32 - 1 the stream continues at nonce 1,
    counter 0 (never a wrapped counter under the same nonce)."""
    secret = hashlib.sha256(b"wrap").digest()
    key = _stream_key(secret, 4, (1, 2), 1, 0, dim)
    width, boundary = 8 * dim, 64 * 2**32
    first = boundary // width - 1  # its bytes reach up to or across the boundary
    stream = keys.PairStream(secret, SESSION, 4, (1, 2), 1, 0, dim)
    for r in range(first, first + 3):
        assert stream.read(r) == _keystream(key, r * width, width), f"round {r}"
    last = 2**64 - 1
    assert stream.read(last) == _keystream(key, last * width, width)


@pytest.mark.parametrize("dim", [1, 5, 3000])
def test_a_read_into_a_buffer_gives_the_read_bytes_across_the_boundary_too(dim):
    """`read_into` (the u4 bank's, into one reused buffer) is `read`, byte for byte, in
    order, seeking and across a 2^32-block boundary; a buffer of another size is refused."""
    secret = hashlib.sha256(b"into").digest()
    stream = keys.PairStream(secret, SESSION, 4, (1, 2), 1, 0, dim, 4)
    other = keys.PairStream(secret, SESSION, 4, (1, 2), 1, 0, dim, 4)
    out = np.empty(dim, dtype="<u4")
    first = 64 * 2**32 // (4 * dim) - 1
    for r in (0, 1, 2, 9, 3, first, first + 1, first + 2, 2**64 - 1):
        stream.read_into(r, memoryview(out.data).cast("B"))
        assert out.tobytes() == other.read(r), f"round {r}"
    with pytest.raises(ValueError, match="not within"):
        stream.read_into(0, memoryview(np.empty(dim + 1, dtype="<u4").data).cast("B"))


@given(
    pairs=st.lists(
        st.tuples(st.integers(0, 40), st.integers(0, 40)).filter(lambda p: p[0] != p[1]),
        min_size=1,
        max_size=12,
    ),
    dim=st.integers(1, 5),
)
@settings(max_examples=50, deadline=None)
def test_batched_masks_equal_masks_derived_one_at_a_time(
    pairs: list[tuple[int, int]], dim: int
) -> None:
    """The core maps a whole step's keystreams to Laplace at once; each row must be the
    very mask pair_noise derives for that pair alone."""
    secret = hashlib.sha256(b"batch").digest()
    streams = b"".join(keys.PairStream(secret, SESSION, 9, p, 1, 2, dim).read(4) for p in pairs)
    batch = stream_laplace(streams, dim, SIGMA_G)
    assert batch.shape == (len(pairs), dim)
    for row, p in zip(batch, pairs, strict=True):
        mask = pair_noise(secret, SESSION, 9, p, 4, 1, dim, SIGMA_G, epoch=2)
        np.testing.assert_array_equal(row, mask)


def _bank_case(
    dim: int, ahead: int
) -> tuple[list[tuple[int, int, int]], np.ndarray, keys.MaskBank]:
    """Five pairs at three hubs, combined as the core combines them (side / weight)."""
    secret = hashlib.sha256(b"bank").digest()
    pairs = [(4, 1, 2), (4, 1, 3), (6, 1, 2), (6, 1, 5), (8, 1, 9)]  # (hub, me, partner)
    coeffs = np.zeros((3, len(pairs)))
    for col, (hub, _, _) in enumerate(pairs):
        coeffs[[4, 6, 8].index(hub), col] = (-1) ** col / (0.1 + hub / 10)
    streams = [keys.PairStream(secret, SESSION, h, (a, b), 2, 0, dim) for h, a, b in pairs]
    return pairs, coeffs, keys.MaskBank(streams, coeffs, dim, SIGMA_G, ahead=ahead)


@pytest.mark.parametrize(("dim", "ahead"), [(1, 1), (2, 3), (3, 64)])
def test_mask_bank_combines_the_masks_each_pair_derives_alone(dim, ahead):
    """Round by round across refills, and out of order: row h of round i is
    sum_p coeffs[h, p] * pair_noise(p, i)."""
    secret = hashlib.sha256(b"bank").digest()
    pairs, coeffs, bank = _bank_case(dim, ahead)
    last = 10
    for r in [*range(1, last + 1), 4, 9, 2, 10]:
        masks = np.stack(
            [
                pair_noise(secret, SESSION, h, (a, b), r, 2, dim, SIGMA_G, epoch=0)
                for h, a, b in pairs
            ]
        )
        np.testing.assert_allclose(bank.at(r, last), coeffs @ masks, rtol=1e-13, atol=0)


def test_mask_bank_reads_nothing_past_the_epochs_last_round():
    """With every-round re-keying the last round is the round itself: one round, no more."""
    _, _, bank = _bank_case(dim=2, ahead=64)
    bank.at(5, last=5)
    with pytest.raises(ValueError, match="past the epoch's last round"):
        bank.at(6, last=5)


def test_a_mask_bank_without_pairs_combines_nothing():
    """An agent that sits at no hub (all its out-neighbours are itself): no masks."""
    bank = keys.MaskBank([], np.zeros((0, 0)), 3, SIGMA_G)
    assert bank.at(1, last=10).shape == (0, 3)


def test_mask_bank_reads_ahead_at_most_its_budget():
    _, _, small = _bank_case(dim=2, ahead=1000)
    _, _, large = _bank_case(dim=10_000, ahead=1000)
    assert small._ahead == keys.MaskBank.BUDGET // (8 * 2 * 5)
    assert large._ahead == 1


def _check_laplace(samples: np.ndarray, sigma_g: float) -> None:
    b = sigma_g / math.sqrt(2.0)
    p = stats.kstest(samples, stats.laplace(loc=0.0, scale=b).cdf).pvalue
    assert p > KS_P_MIN, f"KS test rejects Laplace(0, {b:.4g}): p = {p:.3g}"
    var = float(np.mean(samples**2))  # the mean is known to be 0
    assert abs(var / sigma_g**2 - 1.0) < VAR_REL_TOL, f"variance {var:.4g} vs {sigma_g**2:.4g}"


def test_pair_masks_are_laplace_with_variance_sigma_g_squared():
    """Over the rounds of one stream, read in order as the core reads them."""
    stream = keys.PairStream(hashlib.sha256(b"ks").digest(), SESSION, 5, (3, 7), 0, 0, 1)
    streams = b"".join(stream.read(r) for r in range(KS_SAMPLES))
    _check_laplace(stream_laplace(streams, 1, SIGMA_G).reshape(-1), SIGMA_G)


def test_rng_laplace_is_laplace_with_variance_sigma_g_squared():
    key = (1234, 5678)
    raw = rng.raw_row(key, rng.Domain.NOISE, step=0, round_=0, width=KS_SAMPLES)
    _check_laplace(rng.laplace(rng.uniforms(raw), SIGMA_G), SIGMA_G)


@pytest.mark.parametrize(
    ("change", "words"),
    [
        ({"pair": (3, 3)}, "two different agents"),
        ({"dim": 0}, "dim must be >= 1"),
        ({"round_": -1}, "non-negative"),
        ({"round_": 2**64}, "< 2\\*\\*64"),
        ({"epoch": -1}, "non-negative"),
        ({"hub": 2**32}, "fixed width"),
        ({"sigma_g": math.nan}, "sigma_g"),
    ],
)
def test_pair_noise_rejects_bad_input(change, words):
    with pytest.raises(ValueError, match=words):
        pair_noise(**(BASE | change))


# --- signed key shares -------------------------------------------------------------------

OWNER, HUB, PARTNER = 3, 5, 7


def _share(owner_id: Identity, eph: Ephemeral, *, sender: int, receiver: int) -> KeyShare:
    signature = sign_share(owner_id, SESSION, OWNER, HUB, PARTNER, 0, 4, eph)
    return KeyShare(
        sender=sender,
        receiver=receiver,
        owner=OWNER,
        hub=HUB,
        partner=PARTNER,
        step=0,
        epoch=4,
        public=eph.public,
        signature=signature,
    )


@pytest.fixture
def forwarded() -> KeyShare:
    """A share from agent 3 for agent 7 as hub 5 forwards it."""
    return _share(identity(OWNER), ephemeral(1), sender=HUB, receiver=PARTNER)


def test_honest_share_verifies_on_both_legs(forwarded):
    owner = identity(OWNER).public
    verify_share(owner, forwarded, SESSION)
    verify_share(owner, dataclasses.replace(forwarded, sender=OWNER, receiver=HUB), SESSION)


def test_hub_cannot_swap_in_its_own_key(forwarded):
    """The man in the middle: the hub re-signs its own ephemeral key with its own identity."""
    hub_eph = ephemeral(2)
    forged = dataclasses.replace(
        forwarded,
        public=hub_eph.public,
        signature=sign_share(identity(HUB), SESSION, OWNER, HUB, PARTNER, 0, 4, hub_eph),
    )
    with pytest.raises(BadKey, match="key of agent 3 relayed by hub 5 for agent 7 failed"):
        verify_share(identity(OWNER).public, forged, SESSION)


@settings(max_examples=30, deadline=None)
@given(bit=st.integers(min_value=0, max_value=64 * 8 - 1))
def test_flipped_signature_bit_is_rejected(bit):
    share = _share(identity(OWNER), ephemeral(1), sender=HUB, receiver=PARTNER)
    sig = bytearray(share.signature)
    sig[bit // 8] ^= 1 << (bit % 8)
    flipped = dataclasses.replace(share, signature=bytes(sig))
    with pytest.raises(BadKey, match="agent 3 relayed by hub 5 for agent 7"):
        verify_share(identity(OWNER).public, flipped, SESSION)


@pytest.mark.parametrize(
    "change",
    [{"partner": 8, "receiver": 8}, {"epoch": 5}, {"step": 1}, {"hub": 6, "sender": 6}],
    ids=lambda c: "+".join(c),
)
def test_altered_share_fields_are_rejected(forwarded, change):
    with pytest.raises(BadKey, match="failed its signature check"):
        verify_share(identity(OWNER).public, dataclasses.replace(forwarded, **change), SESSION)


def test_share_redirected_to_another_partner_is_rejected(forwarded):
    """An untouched share delivered to agent 8 instead of 7 is refused by its route."""
    with pytest.raises(BadKey, match="redirected"):
        verify_share(identity(OWNER).public, dataclasses.replace(forwarded, receiver=8), SESSION)


def test_share_from_another_session_is_rejected(forwarded):
    with pytest.raises(BadKey, match="failed its signature check"):
        verify_share(identity(OWNER).public, forwarded, b"another-session")


def test_share_checked_against_the_wrong_owner_is_rejected(forwarded):
    with pytest.raises(BadKey, match="failed its signature check"):
        verify_share(identity(9).public, forwarded, SESSION)


def test_share_statement_is_unambiguous():
    pub = ephemeral(1).public
    statements = {
        share_statement(b"ab", 1, 2, 3, 0, 0, pub),
        share_statement(b"a", 1, 2, 3, 0, 0, pub),
        share_statement(b"ab", 2, 1, 3, 0, 0, pub),
        share_statement(b"ab", 1, 2, 3, 1, 0, pub),
        share_statement(b"ab", 1, 2, 3, 0, 1, pub),
    }
    assert len(statements) == 5
    with pytest.raises(BadKey, match="32 bytes"):
        share_statement(b"ab", 1, 2, 3, 0, 0, pub[:31])


# --- ephemeral agreement -----------------------------------------------------------------


def test_ephemeral_agreement_is_symmetric():
    a, b = Ephemeral.generate(), Ephemeral.generate()
    secret = a.agree(b.public)
    assert len(secret) == 32
    assert secret == b.agree(a.public)
    assert secret != a.agree(Ephemeral.generate().public)


@pytest.mark.parametrize("bad", LOW_ORDER, ids=lambda b: b.hex()[:8])
def test_agree_rejects_low_order_keys(bad):
    with pytest.raises(BadKey, match="key of agent 4: not a usable X25519 key"):
        Ephemeral.generate().agree(bad, what="key of agent 4")


@pytest.mark.parametrize("length", [0, 31, 33, 64])
def test_agree_rejects_wrong_length(length):
    with pytest.raises(BadKey, match=f"32 bytes, got {length}"):
        Ephemeral.generate().agree(bytes(range(length)))


# --- identities and link keys ------------------------------------------------------------


def test_public_identity_roundtrips_and_checks_length():
    pub = identity(1).public
    wire = pub.to_bytes()
    assert len(wire) == 64
    assert PublicIdentity.from_bytes(wire) == pub
    with pytest.raises(BadKey, match="64 bytes"):
        PublicIdentity.from_bytes(wire[:63])
    with pytest.raises(BadKey, match="static key must be 32"):
        PublicIdentity(signing=pub.signing, static=pub.static[:5])


def test_identity_signature_verifies_only_for_its_data():
    me = identity(1)
    sig = me.sign(b"hello")
    me.public.verify(sig, b"hello", what="agent 1's hello")
    with pytest.raises(BadKey, match="agent 1's hello: signature check failed"):
        me.public.verify(sig, b"hellO", what="agent 1's hello")
    with pytest.raises(BadKey, match="signature check failed"):
        identity(2).public.verify(sig, b"hello", what="agent 1's hello")


@settings(max_examples=30, deadline=None)
@given(
    key_a=seeds,
    key_b=seeds,
    session=st.binary(max_size=32),
    ids=st.tuples(agent_ids, agent_ids).filter(lambda p: p[0] != p[1]),
)
def test_link_key_is_symmetric(key_a, key_b, session, ids):
    a, b = (
        Identity(Ed25519PrivateKey.from_private_bytes(k), X25519PrivateKey.from_private_bytes(k))
        for k in (key_a, key_b)
    )
    i, j = ids
    k = link_key(a, b.public, session, i, j)
    assert len(k) == 32
    assert k == link_key(b, a.public, session, j, i)


def test_link_keys_differ_per_link_and_session():
    a, b, c = identity(1), identity(2), identity(3)
    keys = {
        link_key(a, b.public, SESSION, 1, 2),
        link_key(a, c.public, SESSION, 1, 3),
        link_key(b, c.public, SESSION, 2, 3),
        link_key(a, b.public, b"other-session", 1, 2),
        link_key(a, b.public, SESSION, 1, 4),  # same keys, other ids: still another link
    }
    assert len(keys) == 5
    with pytest.raises(ValueError, match="two different agents"):
        link_key(a, b.public, SESSION, 1, 1)


# --- sealing -----------------------------------------------------------------------------

RECIPIENT = X25519PrivateKey.from_private_bytes(hashlib.sha256(b"orchestrator").digest())
RECIPIENT_PUBLIC = public_bytes(RECIPIENT.public_key())


@settings(max_examples=30, deadline=None)
@given(plaintext=st.binary(max_size=300), context=st.binary(max_size=40))
def test_seal_roundtrip(plaintext, context):
    blob = seal(RECIPIENT_PUBLIC, plaintext, context)
    assert len(blob) == len(plaintext) + SEAL_OVERHEAD
    assert open_sealed(RECIPIENT, blob, context) == plaintext


def test_seal_is_fresh_each_time():
    assert seal(RECIPIENT_PUBLIC, b"w", b"ctx") != seal(RECIPIENT_PUBLIC, b"w", b"ctx")


@settings(max_examples=40, deadline=None)
@given(data=st.data())
def test_tampered_blob_is_rejected(data):
    blob = seal(RECIPIENT_PUBLIC, b"model bytes", b"report/3/11")
    index = data.draw(st.integers(min_value=0, max_value=len(blob) - 1))
    flip = data.draw(st.integers(min_value=1, max_value=255))
    tampered = bytearray(blob)
    tampered[index] ^= flip
    with pytest.raises(BadKey):
        open_sealed(RECIPIENT, bytes(tampered), b"report/3/11")


def test_wrong_context_wrong_key_and_short_blob_are_rejected():
    blob = seal(RECIPIENT_PUBLIC, b"model bytes", b"report/3/11")
    with pytest.raises(BadKey, match="wrong context"):
        open_sealed(RECIPIENT, blob, b"report/3/12")
    with pytest.raises(BadKey, match="another key"):
        open_sealed(X25519PrivateKey.generate(), blob, b"report/3/11")
    with pytest.raises(BadKey, match="shorter than the 60-byte minimum"):
        open_sealed(RECIPIENT, blob[:59], b"report/3/11")


@pytest.mark.parametrize("bad", [LOW_ORDER[0], b"short"], ids=["low-order", "short"])
def test_seal_rejects_a_bad_recipient_key(bad):
    with pytest.raises(BadKey, match="recipient's static key"):
        seal(bad, b"x", b"ctx")
