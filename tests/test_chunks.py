"""Models over one peer frame (privnet/agent/wire/chunks.py, reassembled by privnet/agent/links.py):
the frames, their bound places (a chunk lost, reordered, spliced from another round, step or
link, or replayed is refused under its own reason and changes nothing it should not), what a
receiver holds, and a model whose chunks straddle a membership view change."""

from __future__ import annotations

import json
import subprocess
import time
from collections import Counter
from dataclasses import replace
from importlib import resources
from pathlib import Path

import msgpack
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from router import Routed
from runs import RUN, Clock, Harness, assert_same_models

from privnet.agent import topics, wire
from privnet.agent.access import BrokerAddress
from privnet.agent.links import Links
from privnet.agent.messages import Model, Rejected
from privnet.agent.phases import Phase
from privnet.agent.protocol import Publish
from privnet.agent.spec import (
    COUNT_LIMIT,
    ID_LIMIT,
    STEPS,
    ConfigError,
    Scheme,
    Strategy,
    WireDtype,
)
from privnet.agent.wire import chunks
from privnet.broker.launcher import accepts, free_port, launch
from privnet.orchestrator.cli import main
from privnet.orchestrator.engines.memory import Network
from privnet.orchestrator.experiment.config import ExperimentConfig, load
from privnet.orchestrator.experiment.instance import Instance
from privnet.orchestrator.experiment.specs import session_list, session_plans

KEY, OTHER_KEY = bytes(range(32)), bytes(range(1, 33))
ME, PEER, THIRD, VIEW = 5, 3, 7, 4
DIM = 4 * chunks.CHUNK_BYTES // 8 - 100  # four chunks, the last one short
FUZZ = settings(derandomize=True, max_examples=25, deadline=None)


def ends(sealed: bool = True, dim: int = DIM) -> tuple[Links, Links]:
    """The sender PEER's links and the receiver ME's (which also hears THIRD)."""
    return (
        Links(RUN, PEER, dim, VIEW, {ME: KEY}, sealed=sealed),
        Links(RUN, ME, dim, VIEW, {PEER: KEY, THIRD: OTHER_KEY}, sealed=sealed),
    )


def vector(seed: int = 0, dim: int = DIM) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(dim)


def frames_of(sender: Links, round_: int = 7, step: int = 2, seed: int = 0) -> list[bytes]:
    return sender.frames(Model(PEER, ME, round_, step, vector(seed, sender.dim), VIEW))


def rehead(frame: bytes, **head: int) -> bytes:
    """`frame` with fields of its clear head changed, its box as it was."""
    _, name, raw, box = msgpack.unpackb(frame)
    fields = msgpack.unpackb(raw) | head
    return msgpack.packb([wire.VERSION, name, msgpack.packb(fields), box])


def feed(receiver: Links, frames: list[bytes], sender: int = PEER) -> tuple[list, Counter[str]]:
    """Every frame delivered in order: what came out of each, and the reasons refused."""
    out, refused = [], Counter[str]()
    for frame in frames:
        try:
            out.append(receiver.decode(frame, sender))
        except Rejected as exc:
            refused[exc.reason.value] += 1
            out.append(exc.reason.value)
    return out, refused


def whole(out: list, seed: int = 0, round_: int = 7) -> bool:
    """Whether `out` ends in the model of `seed` at `round_`, after only Nones."""
    *first, last = out
    return (
        all(x is None for x in first)
        and isinstance(last, Model)
        and last.round == round_
        and np.array_equal(last.vector, vector(seed, len(last.vector)))
    )


# ---- the frames --------------------------------------------------------------------------------


@FUZZ
@given(
    st.integers(wire.max_model_dim() + 1, 3 * chunks.CHUNK_BYTES // 8 + 7),
    st.booleans(),
    st.integers(0, 2**32 - 1),
)
def test_a_model_over_one_frame_goes_in_chunks_and_comes_back_whole(
    dim: int, sealed: bool, seed: int
) -> None:
    sender, receiver = ends(sealed, dim)
    frames = frames_of(sender, seed=seed)
    assert len(frames) == wire.chunk_count(dim) >= 2
    assert all(len(f) <= wire.MAX_PEER_BYTES for f in frames)
    assert all(f.startswith(chunks.CHUNK_HEAD) for f in frames)
    out, refused = feed(receiver, frames)
    assert not refused and whole(out, seed)
    assert receiver.held_bytes == 0  # nothing kept once the model is whole


def test_a_sealed_chunk_shows_nothing_of_the_model() -> None:
    w = vector(1)
    frames = frames_of(ends()[0], seed=1)
    data = w.tobytes()
    for n, frame in enumerate(frames):
        piece = data[n * chunks.CHUNK_BYTES : (n + 1) * chunks.CHUNK_BYTES]
        assert piece[:64] not in frame and piece[-64:] not in frame
    visible = frames_of(ends(sealed=False)[0], seed=1)
    assert data[:64] in visible[0]  # --seal-links off: the paper's visible wire


def test_a_model_that_fits_one_frame_is_the_one_frame_it_always_was() -> None:
    dim = wire.max_model_dim()
    for sealed in (True, False):
        sender = Links(RUN, PEER, dim, VIEW, {ME: KEY}, sealed=sealed)
        msg = Model(PEER, ME, 7, 2, vector(2, dim), VIEW)
        assert sender.frames(msg) == [sender.encode(msg)]
    assert wire.model_frame_bytes(dim) <= wire.MAX_PEER_BYTES
    assert not wire.needs_chunks(dim) and wire.needs_chunks(dim + 1)


def test_the_widest_chunk_frame_fits_one_peer_frame() -> None:
    """Every count at its widest (ids, round, view, index and count): still one frame."""
    big = {"s": ID_LIMIT - 1, "r": ID_LIMIT - 2, "i": COUNT_LIMIT - 1, "j": STEPS[0]}
    widest = msgpack.packb(big | {"v": COUNT_LIMIT - 1, "c": wire.MAX_CHUNKS - 1, "n": 4096})
    frame = frames_of(ends()[0])[0]
    _, _, raw, _ = msgpack.unpackb(frame)
    overhead = len(frame) - len(raw) - chunks.CHUNK_BYTES - chunks.TAG_BYTES
    assert overhead == len(chunks.CHUNK_HEAD) + 2 + 3  # bin8 head, bin16 box
    assert len(chunks.CHUNK_HEAD) + 2 + len(widest) + 3 + chunks.CHUNK_BYTES + 16 <= (
        wire.MAX_PEER_BYTES
    )


# ---- refusals, each under its own reason ---------------------------------------------------------


@FUZZ
@given(st.integers(0, 3), st.booleans())
def test_a_lost_chunk_loses_its_model_and_the_next_one_comes_whole(lost: int, sealed: bool) -> None:
    sender, receiver = ends(sealed)
    frames = frames_of(sender)
    out, refused = feed(receiver, frames[:lost] + frames[lost + 1 :])
    assert not any(isinstance(x, Model) for x in out)
    assert refused == Counter({"chunk-gap": 3 - lost} if lost < 3 else {})
    out, refused = feed(receiver, frames_of(sender, round_=8, seed=5))
    assert not refused and whole(out, seed=5, round_=8)


@FUZZ
@given(st.integers(0, 2))
def test_reordered_chunks_are_refused_as_such(first: int) -> None:
    sender, receiver = ends()
    frames = frames_of(sender)
    frames[first], frames[first + 1] = frames[first + 1], frames[first]
    out, refused = feed(receiver, frames)
    assert out[first] == "chunk-gap" and out[first + 1] == "chunk-order"
    assert refused == Counter({"chunk-gap": 3 - first, "chunk-order": 1})
    assert not any(isinstance(x, Model) for x in out)


@pytest.mark.parametrize(
    ("splice", "reason"),
    [
        ({"i": 8}, "bad-seal"),  # to another round
        ({"j": 2}, "bad-seal"),  # to another step
        ({"c": 2}, "bad-seal"),  # to another place in its model
        ({"n": 5}, "shape"),  # into a model of another size
        ({"v": VIEW - 1}, "stale-view"),
        ({"r": ME + 1}, "wrong-receiver"),
    ],
)
def test_a_chunk_spliced_elsewhere_is_refused_and_the_model_still_comes(
    splice: dict[str, int], reason: str
) -> None:
    sender, receiver = ends()
    frames = frames_of(sender, step=STEPS[0])  # spliced to a later place, it is opened
    out, refused = feed(receiver, [frames[0], rehead(frames[1], **splice), *frames[1:]])
    assert out[1] == reason and refused == Counter({reason: 1})
    assert whole([out[0], *out[2:]])


def test_a_chunk_of_another_link_is_refused() -> None:
    """Sealed for THIRD -> ME: on PEER's topic as it is (spoofed), or claiming PEER (the seal
    fails: another key); a chunk of another round placed into this one fails its seal too."""
    _, receiver = ends()
    third = Links(RUN, THIRD, DIM, VIEW, {ME: OTHER_KEY})
    theirs = third.frames(Model(THIRD, ME, 7, 2, vector(9), VIEW))
    earlier = frames_of(ends()[0], round_=6)
    frames = frames_of(ends()[0])
    hostile = [theirs[1], rehead(theirs[1], s=PEER), rehead(earlier[1], i=7)]
    out, refused = feed(receiver, [frames[0], *hostile, *frames[1:]])
    assert out[1:4] == ["spoofed", "bad-seal", "bad-seal"]
    assert refused == Counter({"spoofed": 1, "bad-seal": 2})
    assert whole([out[0], *out[4:]])


def test_replayed_chunks_are_refused() -> None:
    sender, receiver = ends()
    old, frames = frames_of(sender, round_=6, seed=3), frames_of(sender)
    out, refused = feed(receiver, old)
    assert whole(out, seed=3, round_=6)
    again = [frames[0], frames[0], frames[1], old[2], frames[1], *frames[2:], frames[3], old[0]]
    out, refused = feed(receiver, again)
    assert out[1] == out[3] == out[4] == out[-2] == out[-1] == "replay"
    assert refused == Counter({"replay": 5})
    assert whole([out[0], out[2], *out[5:7]])


def test_what_a_receiver_holds_is_one_model_per_in_link() -> None:
    """Two in-links each starting a model every round and never finishing it: at most one
    buffer each; a forged start of a later model (its seal fails) takes nothing held."""
    peer, receiver = ends()
    third = Links(RUN, THIRD, DIM, VIEW, {ME: OTHER_KEY})
    for round_ in range(1, 40):
        assert receiver.decode(frames_of(peer, round_=round_)[0], PEER) is None
        start = third.frames(Model(THIRD, ME, round_, 2, vector(round_), VIEW))[0]
        assert receiver.decode(start, THIRD) is None
        assert receiver.held_bytes == 2 * 8 * DIM
    frames = frames_of(peer, round_=40, seed=4)
    out, refused = feed(receiver, [frames[0], rehead(frames[0], i=41), *frames[1:]])
    assert refused == Counter({"bad-seal": 1}) and whole([out[0], *out[2:]], 4, 40)
    assert receiver.held_bytes == 8 * DIM  # THIRD's model still in flight


# ---- a model whose chunks straddle a membership change -------------------------------------------


def wide_mlp() -> Instance:
    """An mlp on digits of 9,890 parameters: two chunks a model on the f8 wire (the float32
    mlp's default, u4, carries it in one frame)."""
    config = ExperimentConfig(
        agents=4, iters=3, repeats=1, seed=2, samples=20, problem="mlp", dataset="digits",
        params={"hidden": [130]}, wire_dtype=WireDtype.F8,
    )  # fmt: skip
    return Instance.build(config)


def harness(problem: Instance) -> Harness:
    plans = session_plans(problem, [(Strategy.ATC, Scheme.LOCAL_GHP, 0)])
    net = Routed.build(plans, deadline=30.0, run=RUN)
    h = Harness(net, Clock())
    net.router.clock = h.clock
    net.router.edit = h._edit
    return h


def later_chunks(publisher: str, frame: Publish) -> bool:
    """Agent 1's chunks after the first, of round 2 in view 0."""
    if publisher != "agent-1" or not chunks.is_chunk(frame.payload):
        return False
    head = chunks.read_chunk(frame.payload)
    return head.view == 0 and head.round == 2 and head.index > 0


def test_a_model_whose_chunks_straddle_a_view_change_is_dropped_and_counted() -> None:
    """Agent 1's round-2 model reaches its neighbours as its first chunk only: the round
    stalls, the conductor redoes it under view 1, and the rest of the old model, arriving
    then, is refused as stale-view by each receiver; the models are a clean run's."""
    problem = wide_mlp()
    assert wire.chunk_count(problem.config.dim) == 2
    h = harness(problem)
    h.hold = later_chunks
    h.start()
    held = list(h.held)
    assert held
    h.held.clear()
    receivers = [topics.parse_peer_topic(frame.topic) for _, frame in held]
    nodes = [h.nodes[k] for _, k, _ in receivers]  # type: ignore[misc]

    def late() -> None:
        for (_, frame), node in zip(held, nodes, strict=True):
            assert h.deliver(node, frame.topic, frame.payload).publish == []

    h.when(lambda: all(n.view >= 1 and n.phase is Phase.RUNNING for n in nodes), late)
    h.advance(60.0)
    results = h.finish()
    assert h.fired == 1 and h.conductor.membership.views[1].reason == "stalled"
    assert h.rejected() == Counter({"stale-view": len(held)})
    h.assert_all_counted()
    clean = harness(problem).play()
    assert_same_models(results, clean)


def test_a_model_one_telemetry_message_cannot_carry_goes_in_parts_every_k_rounds() -> None:
    """A model one telemetry message cannot carry goes in Parts, every K rounds (a chunked
    model's audit: tests/test_audit_sample.py)."""
    config = ExperimentConfig(
        agents=3, iters=2, problem="mlp", dataset="digits", params={"hidden": [2000]}
    )
    problem = Instance.build(config)
    big = session_plans(problem, [(Strategy.ATC, Scheme.NONE, 0)])
    assert big[0].dim == 152_010 > wire.max_report_dim() and big[0].dim > wire.SETUP_FLOATS
    assert wire.default_models_every(big[0].dim) == wire.part_count(big[0].dim) == 2
    net = Network.build(big, telemetry=False)
    net.play()
    for node in net.nodes:  # its Setup had no room for w0: each agent made the problem's own
        assert node.session is not None and node.session.core.round == 3
        assert not node.session.config.spec.w0
        assert np.array_equal(node.session.history[0], problem.w0) and problem.w0.any()
    (told,) = Network.build(big).play()  # telemetry: metrics every round, models at 2 only
    assert told.models_every == 2 and told.metrics is not None
    assert np.isnan(told.models[0, :, 0]).all() and not np.isnan(told.metrics).any()
    # a float32 problem: its Parts travel as float32 (one Part holds it), so the stored
    # models are the agents' rounded to float32; as float64 Parts they are exact
    assert problem.float32 and big[0].telemetry_dtype == wire.F4
    assert wire.part_count(big[0].dim, wire.F4) == 1
    (exact,) = Network.build([replace(big[0], models_f4=False)]).play()
    for node in net.nodes:
        assert node.session is not None
        held = node.session.history[2]
        assert np.array_equal(told.models[1, node.me], wire.as_telemetered(held, wire.F4))
        assert not np.array_equal(told.models[1, node.me], held)
        assert np.array_equal(exact.models[1, node.me], held)


# ---- the broker's limits ------------------------------------------------------------------------


def test_the_packet_limit_covers_every_plane() -> None:
    """A control or telemetry message at its limit, and a peer frame at its limit, each on
    the longest topic privnet uses, are packets within MAX_PACKET_SIZE."""
    run, agent = "r" * 64, ID_LIMIT - 1
    longest = max(
        (topics.telemetry(run, agent), topics.ctl_up(run, agent), topics.ctl_down(run, agent)),
        key=len,
    )
    assert topics.mqtt_publish_size(longest, wire.MAX_CONTROL_BYTES, 1) <= topics.MAX_PACKET_SIZE
    peer = topics.peer_topic(run, agent, agent - 1)
    assert topics.mqtt_publish_size(peer, wire.MAX_PEER_BYTES, 0) <= topics.MAX_PACKET_SIZE
    conf = (resources.files("privnet.broker") / "mosquitto.conf").read_text()
    assert f"\nmax_packet_size {topics.MAX_PACKET_SIZE}\n" in conf


def small_mosquitto(tmp_path: Path, limit: int | None) -> tuple[subprocess.Popen[bytes], str]:
    """A mosquitto of this test's own, stating `limit` as its Maximum Packet Size."""
    port = free_port()
    conf = tmp_path / "small.conf"
    setting = f"max_packet_size {limit}\n" if limit is not None else ""
    conf.write_text(f"listener {port} 127.0.0.1\nallow_anonymous true\n{setting}")
    proc = subprocess.Popen(["mosquitto", "-c", str(conf)], stderr=subprocess.DEVNULL)
    address = f"127.0.0.1:{port}"
    for _ in range(100):
        if accepts(BrokerAddress.parse(address), timeout=0.1):
            break
        time.sleep(0.05)
    return proc, address


def test_an_external_broker_whose_packets_are_too_small_is_refused_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    proc, address = small_mosquitto(tmp_path, 100_000)
    try:
        with pytest.raises(ConfigError) as caught:
            launch(address).start()
        message = str(caught.value)
        assert "\n" not in message and "at most 100,000 bytes" in message
        assert f"set `max_packet_size {topics.MAX_PACKET_SIZE}`" in message
        argv = ["run", "--agents", "3", "--iters", "2", "--broker", address]
        assert main([*argv, "--out", str(tmp_path / "out")]) != 0
        assert "at most 100,000 bytes" in capsys.readouterr().err
    finally:
        proc.terminate()
        proc.wait(10)
    for limit in (None, topics.MAX_PACKET_SIZE):  # none stated, or enough: taken
        proc, address = small_mosquitto(tmp_path, limit)
        try:
            launch(address).start()
        finally:
            proc.terminate()
            proc.wait(10)


# ---- a real run -------------------------------------------------------------------------------

WIDE = """[experiment]
name = "wide-mlp"
problem = "mlp"
dataset = "digits"
agents = 4
samples = 40
iters = 5
mu = 0.1
seed = 3
strategies = ["atc"]
schemes = ["none", "local-ghp"]
wire_dtype = "f8"

[experiment.params]
hidden = [320]
"""


@pytest.mark.net
def test_a_run_on_mosquitto_carries_models_over_one_frame_as_memory_computes_them(
    tmp_path: Path,
) -> None:
    """`privnet run` of an mlp of 24,330 parameters (three chunks a model on the f8 wire; one
    frame held 8,179) on mosquitto: no frame refused, every model frame a whole model's chunks, and
    every agent's model after every round the memory engine's."""
    toml = tmp_path / "wide.toml"
    toml.write_text(WIDE)
    out = tmp_path / "out"
    assert main(["run", "--config", str(toml), "--broker", "mosquitto", "--out", str(out)]) == 0
    config = load(toml)
    problem = Instance.build(config)
    dim = problem.config.dim
    assert dim == 24_330 > wire.max_model_dim() and wire.chunk_count(dim) == 3
    summary = json.loads((out / "summary.json").read_text())
    edges = int(np.count_nonzero(problem.A) - len(problem.A))  # directed, self-loops out
    for result in summary["results"]:
        assert result["rejected"] == {}
        assert result["messages"]["model"] == 5 * edges * 3  # rounds x releases x chunks
    memory = Network.build(session_plans(problem, session_list(config))).play()
    real = np.load(out / "models.npz")
    for session in memory:
        got = real[session.label]
        assert got.shape == session.models.shape and not np.isnan(got).any()
        gap = np.max(np.abs(got - session.models)) / np.max(np.abs(session.models))
        assert gap < 1e-9, (session.label, gap)
