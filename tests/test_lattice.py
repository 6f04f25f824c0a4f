"""The u4 wire form (`--wire-dtype u4`, privnet.agent.lattice): releases as lattice words mod
2^32. Pure parts first (round trip, masks cancelling in the modular sum, the range refused),
then the frames, then the engines agreeing (memory == oracle; the network: tests/test_net.py).
"""

from __future__ import annotations

from dataclasses import replace

import msgpack
import numpy as np
import pytest
import test_wire
from hypothesis import given, settings
from hypothesis import strategies as st

import privnet
from privnet.agent import keys, lattice, rng, wire
from privnet.agent.links import Links
from privnet.agent.messages import Model, Reason, Rejected
from privnet.agent.spec import ConfigError, WireDtype
from privnet.agent.wire import chunks
from privnet.orchestrator.errors import RunFailed

FUZZ = settings(derandomize=True, max_examples=40, deadline=None)
STEP = 2.0**-24
RUN, ME, PEER, VIEW = "run", 2, 5, 0
KEY = bytes(range(32))
SESSION = bytes(range(16))

in_range = st.floats(-100.0, 100.0, allow_nan=False)
vectors = st.lists(in_range, min_size=1, max_size=40).map(np.array)


# ---- the pure parts ----------------------------------------------------------------------------


@FUZZ
@given(vectors)
def test_words_round_trip_to_the_lattice_point(v: np.ndarray) -> None:
    """A release's words read back are exactly the release rounded to the lattice."""
    words = lattice.words(v, STEP, "test")
    assert words.dtype == np.uint32
    np.testing.assert_array_equal(lattice.values(words, STEP), rng.on_lattice(v, 1.0, STEP))


def streams(seed: int, pairs: int, dim: int) -> list[keys.PairStream]:
    secrets = np.random.default_rng(seed).bytes(32 * pairs)
    return [
        keys.PairStream(secrets[32 * p : 32 * (p + 1)], SESSION, 9, (p, p + 1), 0, 0, dim, 4)
        for p in range(pairs)
    ]


@FUZZ
@given(
    st.integers(0, 2**32),
    st.integers(1, 6),
    st.lists(st.floats(0.05, 1.0), min_size=2, max_size=7),
    st.integers(1, 50),
)
def test_masks_cancel_exactly_in_the_modular_sum(
    seed: int, pairs: int, weights: list[float], dim: int
) -> None:
    """A hub's senders each add +u or -u of their pairs' words; the hub's sum mod 2^32 is
    the sum of the weighted lattice terms, exactly, whatever the masks (uniform words)."""
    a = np.array(weights) / sum(weights)  # in-weights sum to 1, as spec checks
    senders = len(a)
    gen = np.random.default_rng(seed)
    v = gen.uniform(-100, 100, (senders, dim))
    pair_streams = streams(seed, pairs, dim)
    plus = np.zeros((senders, pairs))  # pair p joins senders p % n (+1) and (p + 1) % n (-1)
    for p in range(pairs):
        plus[p % senders, p] += 1
        plus[(p + 1) % senders, p] -= 1
    rows = []
    for m in range(senders):
        mine = [p for p in range(pairs) if plus[m, p]]
        bank = keys.WordBank([pair_streams[p] for p in mine], plus[m : m + 1, mine], dim)
        rows.append(bank.at(3, 3)[0])
    sent = [
        lattice.masked_words(v[m], rows[m][None], a[m : m + 1, None], STEP, "t")[0]
        for m in range(senders)
    ]
    total = lattice.total(np.array(sent), STEP, "hub")
    expected = rng.on_lattice(v, a[:, None], STEP).sum(axis=0)
    np.testing.assert_array_equal(total, expected)
    if pairs and dim > 4:  # and the masks did hide: a sender's words are not its term
        assert not np.array_equal(sent[0], lattice.words(a[0] * v[0], STEP, "t"))


def test_word_bank_reads_the_pair_stream_as_u4_words() -> None:
    """One frombuffer a pair: row = +stream0 - stream1 mod 2^32."""
    two = streams(1, 2, 8)
    bank = keys.WordBank(two, np.array([[1.0, -1.0]]), 8)
    raw = [np.frombuffer(s.read(5), dtype="<u4") for s in streams(1, 2, 8)]
    np.testing.assert_array_equal(bank.at(5, 5)[0], raw[0] - raw[1])


def test_word_bank_rows_are_signed_sums_of_their_pairs_streams_at_any_size() -> None:
    """Every row = sum of +-stream words mod 2^32, whichever sign comes first, across
    several PIECEs; a row no pair masks is zero; out-of-order rounds read the same words."""
    dim = 2 * keys.WordBank.PIECE + 3
    coeffs = np.array([[-1, 1, 0, 0, -1], [0, 0, 1, -1, 0], [0, 0, 0, 0, 0]], dtype=float)
    bank = keys.WordBank(streams(1, 5, dim), coeffs, dim)
    for round_ in (4, 2, 3):
        raw = np.array([np.frombuffer(s.read(round_), "<u4") for s in streams(1, 5, dim)])
        expected = np.zeros((3, dim), dtype=np.uint32)
        for p in range(5):
            for h in np.flatnonzero(coeffs[:, p]):
                expected[h] += raw[p] if coeffs[h, p] > 0 else -raw[p]
        np.testing.assert_array_equal(bank.at(round_, 9), expected)
    with pytest.raises(ValueError, match="one \\+1 or -1"):
        keys.WordBank(streams(1, 2, 4), np.array([[1.0, 0.0], [1.0, -1.0]]), 4)


def test_u4_mask_streams_have_their_own_key() -> None:
    """The u4 words are not the f8 masks' first half: another HKDF label."""
    f8 = keys.PairStream(KEY, SESSION, 1, (2, 3), 0, 0, 4).read(0)
    u4 = keys.PairStream(KEY, SESSION, 1, (2, 3), 0, 0, 4, 4).read(0)
    assert len(f8) == 32 and len(u4) == 16 and f8[:16] != u4


@pytest.mark.parametrize("value", [lattice.LIMIT * STEP * 1.01, -200.0, np.nan, np.inf])
def test_a_release_outside_the_range_is_refused(value: float) -> None:
    v = np.array([0.5, value, 1.0])
    with pytest.raises(lattice.OutOfRange) as refused:
        lattice.words(v, STEP, "agent 3, round 7 step 2")
    assert refused.value.reason is Reason.WIRE_RANGE
    assert "entry 1" in refused.value.detail and "--wire-dtype f8" in refused.value.detail
    with pytest.raises(lattice.OutOfRange):  # a masked term: bounded by its weight
        lattice.masked_words(v, np.zeros((1, 3), np.uint32), np.array([[0.5]]), STEP, "x")


def test_the_range_edge_is_taken_and_a_wrapped_total_refused() -> None:
    edge = np.array([lattice.LIMIT * STEP, -lattice.LIMIT * STEP])
    np.testing.assert_array_equal(lattice.values(lattice.words(edge, STEP, "e"), STEP), edge)
    wrapped = np.array([[2**31 - 1], [1]], dtype=np.uint32)  # sums to -2^31 mod 2^32
    with pytest.raises(lattice.OutOfRange, match="the hub"):
        lattice.total(wrapped, STEP, "the hub")


def test_the_lattice_is_the_noise_grid_or_a_fixed_one_without_noise() -> None:
    assert lattice.grid(0.1, WireDtype.U4) == rng.grid(0.1) == lattice.grid(0.1, WireDtype.F8)
    assert lattice.grid(0.0, WireDtype.U4) == lattice.NOISELESS_GRID
    assert lattice.grid(0.0, WireDtype.F8) == 0.0


# ---- the frames ----------------------------------------------------------------------------------


def words(dim: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 2**32, dim, dtype=np.uint32)


@pytest.mark.parametrize("sealed", [True, False])
@pytest.mark.parametrize("dim", [3, 20_000])  # one frame; chunks
def test_u4_models_cross_a_link_as_words(sealed: bool, dim: int) -> None:
    sender = Links(RUN, PEER, dim, VIEW, {ME: KEY}, sealed=sealed, dtype=wire.U4)
    receiver = Links(RUN, ME, dim, VIEW, {PEER: KEY}, sealed=sealed, dtype=wire.U4)
    frames = sender.frames(Model(PEER, ME, 4, 1, words(dim), VIEW))
    assert len(frames) == (2 if dim > 16_000 else 1)  # 16,320 words a chunk
    out = [receiver.decode(f, PEER) for f in frames]
    got = out[-1]
    assert isinstance(got, Model) and got.vector.dtype == np.uint32
    np.testing.assert_array_equal(got.vector, words(dim))
    assert sum(map(len, frames)) < 4 * dim + 200  # 4 bytes a parameter, and the heads


@pytest.mark.parametrize("dim", [3, 20_000])
def test_a_float64_model_on_a_u4_link_is_refused_as_shape(dim: int) -> None:
    sender = Links(RUN, PEER, dim, VIEW, {ME: KEY})
    receiver = Links(RUN, ME, dim, VIEW, {PEER: KEY}, dtype=wire.U4)
    frame = sender.frames(Model(PEER, ME, 4, 1, np.ones(dim), VIEW))[0]
    with pytest.raises(Rejected) as refused:
        receiver.decode(frame, PEER)
    assert refused.value.reason is Reason.SHAPE


def test_a_chunk_head_names_its_words_and_nothing_else() -> None:
    sender = Links(RUN, PEER, 20_000, VIEW, {ME: KEY}, dtype=wire.U4)
    frame = sender.frames(Model(PEER, ME, 4, 1, words(20_000), VIEW))[0]
    head = msgpack.unpackb(msgpack.unpackb(frame)[2])
    assert head["d"] == "<u4" and chunks.read_chunk(frame).dtype == wire.U4
    _, name, _, box = msgpack.unpackb(frame)
    forged = msgpack.packb([wire.VERSION, name, msgpack.packb(head | {"d": "<f4"}), box])
    with pytest.raises(Rejected) as refused:
        chunks.read_chunk(forged)
    assert refused.value.reason is Reason.SCHEMA


def test_an_f8_spec_keeps_its_config_bytes_and_a_u4_one_says_so() -> None:
    """AgentSpec.wire is elided while f8 (tests/test_pins.py pins the Config), carried as
    'u4' otherwise, and read back."""
    config = test_wire.config()
    assert b"wire" not in wire.encode_config(config)
    u4 = replace(config, spec=replace(config.spec, wire=WireDtype.U4))
    data = wire.encode_config(u4)
    assert b"wire" in data
    assert wire.decode_config(data).spec.wire is WireDtype.U4
    assert wire.decode_config(wire.encode_config(config)).spec.wire is WireDtype.F8


# ---- the engines -------------------------------------------------------------------------------


def test_memory_engine_equals_the_oracle_on_the_u4_lattice() -> None:
    """Every scheme: the agents' cores (the memory engine, real frames of 4 bytes a
    parameter) compute what the oracle's matrix recursion does on the lattice; the masked
    schemes bit for bit; none is the f8 run's to the lattice's precision."""
    exp = privnet.Experiment(agents=8, iters=12, seed=3, strategies="atc", wire_dtype="u4")
    memory = privnet.simulate(exp, "memory")
    oracle = privnet.simulate(exp, "oracle").models
    f8 = privnet.simulate(privnet.Experiment(agents=8, iters=12, seed=3, strategies="atc"))
    for key, models in memory.models.items():
        if "masked" in key or "local" in key:
            np.testing.assert_array_equal(models, oracle[key], err_msg=key)
        else:
            np.testing.assert_allclose(models, oracle[key], rtol=0, atol=1e-13, err_msg=key)
        grid = rng.grid(exp.sigma_g)
        assert np.max(np.abs(models - f8.models[key])) < 12 * grid, key
    for curve in memory.curves:
        assert curve.extra["wire_dtype"] == "u4" and curve.extra["params"] == 2
        per_param = curve.extra["bytes_per_param_per_model_frame"]
        assert per_param is not None and per_param < 8 * 2 + 200  # small model: heads dominate


def test_a_model_beyond_the_range_stops_the_run_with_the_reason() -> None:
    """A diverging model (mu = 3) leaves the u4 range: the agents refuse to wrap it."""
    exp = privnet.Experiment(
        agents=6, iters=40, seed=3, strategies="atc", schemes="local-ghp", wire_dtype="u4", mu=3.0
    )
    with pytest.raises(RunFailed, match=r"u4 wire holds .* --wire-dtype f8"):
        privnet.simulate(exp, "memory")


@pytest.mark.parametrize(
    ("extra", "words"),
    [
        ({"topology": "one-peer-exponential"}, "time-varying"),
        ({"byzantine": "1:sign-flip"}, "attacks"),
    ],
)
def test_u4_refuses_what_it_does_not_carry_yet(extra: dict[str, str], words: str) -> None:
    """A schedule's round-by-round masks and an attacker's inbox are f8's: refused, with
    the flag that runs them, when the Experiment is made (before anything runs)."""
    with pytest.raises(ConfigError, match=f"{words}.*--wire-dtype f8"):
        privnet.Experiment(agents=8, iters=3, wire_dtype="u4", **extra)


@pytest.mark.parametrize("shared", [True, False])
def test_masked_words_in_blocks_are_the_whole_array_formula(shared: bool) -> None:
    """Row by row and block by block, into the masks' own array: the words of
    rint(a v / step) + masks mod 2^32 for every row, as the one-expression form gives them;
    an entry out of range in a later block is named by its index in the model."""
    dim, rows = 2 * lattice.BLOCK + 5, 3
    gen = np.random.default_rng(4)
    v = gen.uniform(-50, 50, dim if shared else (rows, dim))
    a = np.array([[0.5], [0.3], [0.2]])
    masks = gen.integers(0, 2**32, (rows, dim), dtype=np.uint32)
    k = np.rint(a * v / STEP)
    expected = k.astype(np.int64).astype(np.uint32) + masks
    got = lattice.masked_words(v, masks.copy(), a, STEP, "t")
    np.testing.assert_array_equal(got, expected)
    into = masks.copy()
    assert lattice.masked_words(v, into, a, STEP, "t", into) is into
    np.testing.assert_array_equal(into, expected)
    far = np.array(v, copy=True)
    (far if shared else far[2])[lattice.BLOCK + 7] = 1e9
    with pytest.raises(lattice.OutOfRange, match=f"entry {lattice.BLOCK + 7} is"):
        lattice.masked_words(far, masks.copy(), a, STEP, "t")


@given(st.floats(-4.0, 4.0), st.floats(0.01, 1.0))
def test_a_model_near_the_range_is_checked_entry_by_entry(offset: float, weight: float) -> None:
    """Where v's extremes cannot vouch for every row (`_inside` is False), each row's
    integers are checked themselves: in range they travel exactly, out of range refused."""
    dim = lattice.BLOCK + 3
    a = np.array([[weight], [1.0]])
    v = np.zeros(dim)
    v[-1] = (lattice.LIMIT + offset) * STEP  # within steps of the edge for the row of weight 1
    masks = np.random.default_rng(5).integers(0, 2**32, (2, dim), dtype=np.uint32)
    assert not lattice._inside(v, a, STEP)
    k = np.rint(a * v / STEP)
    if (np.abs(k) <= a * lattice.LIMIT).all():
        got = lattice.masked_words(v, masks.copy(), a, STEP, "t")
        np.testing.assert_array_equal(got, k.astype(np.int64).astype(np.uint32) + masks)
    else:
        with pytest.raises(lattice.OutOfRange, match=f"entry {dim - 1} is"):
            lattice.masked_words(v, masks.copy(), a, STEP, "t")
