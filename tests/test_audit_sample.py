"""The audit of a big model: a seeded sample of whole chunks, recorded, replayed and checked
on its coordinates, on the f8 and the u4 wire; and `privnet run --audit` on mosquitto with
the sample forced on (`--audit-sample`), `inspect --attack` on its sample."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from cryptography.hazmat.primitives.ciphers.aead import ChaCha20Poly1305
from test_audit import RUN, recorded

import privnet
from privnet.agent import lattice, topics
from privnet.agent.messages import Model
from privnet.agent.spec import Scheme, Strategy, WireDtype
from privnet.agent.wire import chunks
from privnet.agent.wire.schema import U4
from privnet.orchestrator import audit, replay
from privnet.orchestrator.audit import sample as sampling
from privnet.orchestrator.cli import main
from privnet.orchestrator.experiment import specs
from privnet.orchestrator.experiment.config import ExperimentConfig
from privnet.orchestrator.experiment.instance import Instance

DIM = 22_810  # mlp 65 -> 300 -> 10 on digits: 2 chunks a model at u4, 3 at f8
PLANTED_ROUND = 2  # the round of the frame a test replaces


def problem(wire_dtype: WireDtype, schemes: tuple[Scheme, ...] = tuple(Scheme)) -> Instance:
    config = ExperimentConfig(
        agents=6, iters=3, seed=3, samples=100, problem="mlp", dataset="digits",
        params={"hidden": [300]}, strategies=(Strategy.ATC,), schemes=schemes, repeats=1,
        sigma_g2=0.01, wire_dtype=wire_dtype,
    )  # fmt: skip
    built = Instance.build(config)
    assert built.config.dim == DIM
    return built


# ---- the sample -----------------------------------------------------------------------------


def test_the_sample_is_seeded_and_whole_chunks() -> None:
    dim = 10 * chunks.CHUNK_BYTES // 4 + 123  # 11 u4 chunks, the last one short
    one = sampling.draw(dim, U4, 40_000, seed=7)
    assert one is not None and one == sampling.draw(dim, U4, 40_000, seed=7)
    assert one.chunks != sampling.draw(dim, U4, 40_000, seed=8).chunks  # type: ignore[union-attr]
    per = chunks.CHUNK_BYTES // 4
    assert len(one.chunks) == 3 and len(set(one.chunks)) == 3  # ceil(40,000 / 16,320)
    expected = np.concatenate([np.arange(c * per, min((c + 1) * per, dim)) for c in one.chunks])
    assert np.array_equal(one.coordinates, expected) and one.coordinates.size >= 40_000
    assert sampling.Sample.of(one.to_dict()) == one
    # recorded whole: a model of one frame, or no bigger than the sample
    assert sampling.draw(5_000, U4, 1, seed=7) is None
    assert sampling.draw(dim, U4, dim, seed=7) is None
    assert sampling.draw(dim, U4, 1, seed=7) is not None
    with pytest.raises(ValueError, match="at least 1"):
        sampling.draw(dim, U4, 0)


def test_the_tap_keeps_the_sampled_chunks_of_every_model_and_every_other_frame() -> None:
    dim = 3 * chunks.CHUNK_BYTES // 8  # three f8 chunks
    sample = sampling.draw(dim, "<f8", 1, seed=1)
    assert sample is not None and len(sample.chunks) == 1
    topic = topics.peer_topic(RUN, 4, 3)  # from 3 to 4
    vector = np.arange(dim, dtype=np.float64)
    frames = chunks.mac_chunks(Model(3, 4, 1, 1, vector, 0), bytes(32))
    kept = [c for c, f in enumerate(frames) if sampling.recorded(f, topic, sample)]
    assert kept == list(sample.chunks)
    assert sampling.recorded(b"any control frame", topics.ctl_down(RUN, "all"), sample)
    assert sampling.recorded(b"an Escrow", topics.ctl_up(RUN, 3), sample)
    assert not sampling.recorded(b"a model's part", topics.telemetry(RUN, 3), sample)
    assert sampling.recorded(b"a model's part", topics.telemetry(RUN, 3), None)
    assert all(sampling.recorded(f, topic, None) for f in frames)


# ---- the audit on a sample ------------------------------------------------------------------


def sampled_recording(
    built: Instance, sample: sampling.Sample | None
) -> tuple[audit.Recording, list[np.ndarray]]:
    """A memory-engine run of `built`, sealed and escrowed, as the tap with `sample` keeps it."""
    records, telemetry, escrowed = recorded(built, specs.session_list(built.config))
    kept = list(sampling.kept(records, sample))
    if sample is not None:
        assert len(kept) < len(records)
    held = None if sample is None else sample.to_dict()
    recording = audit.Recording(RUN, "127.0.0.1:1883", built.config, kept, escrowed, held)
    return recording, telemetry


@pytest.mark.parametrize("wire_dtype", [WireDtype.U4, WireDtype.F8])
def test_a_sampled_audit_finds_what_the_whole_one_finds(wire_dtype: WireDtype) -> None:
    """On one chunk of each model: every frame counted, none clear under a private scheme and
    every one under none, the masks cancel exactly at every hub (mod 2^32 on u4) and follow
    their law, the replay matches the telemetry on the sample; audit.json says it sampled."""
    built = problem(wire_dtype)
    sample = sampling.draw(DIM, built.wire.code, 1, seed=11)
    assert sample is not None and sample.coordinates.size < DIM
    recording, telemetry = sampled_recording(built, sample)
    report = audit.audit(recording, telemetry, "memory").report
    stated = report["sample"]
    assert stated["sampled"] and stated["seed"] == 11 and stated["dim"] == DIM
    assert stated["coordinates"] == sample.coordinates.size and "a sample" in stated["finding"]
    for s in report["sessions"]:
        assert s["model_messages"] == s["expected_model_messages"] > 0
        assert s["undecodable"] == s["sealed_unopened"] == s["duplicates"] == 0
        assert s["truth_vs_telemetry"] == 0.0
        clear = s["model_messages"] if s["scheme"] == "none" else 0
        assert s["plaintext_messages"] == clear, s["scheme"]
        if s["scheme"] in ("local-ghp", "masked-ghp"):
            resid = s["max_cancellation_residual"]
            assert resid["max"] == 0.0 and resid["hub_rounds_checked"] > 0
            if wire_dtype is WireDtype.U4:  # uniform words, not Laplace draws
                assert s["noise"]["masks"]["samples"] > 10_000
                assert s["noise"]["masks"]["p_value"] > 1e-4
            else:
                assert s["noise"]["p_value"] > 1e-4


def test_a_model_planted_in_the_clear_is_found_on_the_sample() -> None:
    """local-ghp on u4: one frame's sampled chunk re-sealed holding its sender's clear value's
    words (x's own, or a x's without the masks): the sampled audit flags exactly that frame."""
    built = problem(WireDtype.U4, (Scheme.LOCAL_GHP,))
    sample = sampling.draw(DIM, U4, 1, seed=5)
    assert sample is not None
    truth = replay.replay(built, Strategy.ATC, Scheme.LOCAL_GHP)
    step = lattice.grid(built.config.sigma_g, built.wire)
    a = built.matrices(Strategy.ATC)[2]  # ATC's combine step, step 2
    s, r = next((int(m), int(k)) for m, k in zip(*np.nonzero(a), strict=True) if m != k)
    i = PLANTED_ROUND
    for form, scale in (("own", 1.0), ("unmasked", None)):
        recording, telemetry = sampled_recording(built, sample)
        x = truth.views[(0, s, i, 2)]
        weight = a[s, r] if scale is None else scale
        words = lattice.words(weight * x, step, "planted")
        key = recording.link_keys[(0, 0)][(min(s, r), max(s, r))]
        aead = ChaCha20Poly1305(key)
        planted = chunks.seal_chunks(Model(s, r, i, 2, words, 0), aead, RUN)
        topic = topics.peer_topic(RUN, r, s)  # from s to r
        for n, rec in enumerate(recording.records):
            if rec.topic == topic and chunks.is_chunk(rec.payload):
                head = chunks.read_chunk(rec.payload)
                if head.round == i and head.step == 2:
                    recording.records[n] = audit.WireRecord(rec.t, topic, planted[head.index])
        (found,) = audit.audit(recording, telemetry, "memory").report["sessions"]
        assert found["plaintext_messages"] == 1, form
        assert (
            found["links"][[(x["from"], x["to"]) for x in found["links"]].index((s, r))][
                "plaintext"
            ]
            == 1
        )


# ---- a real run ------------------------------------------------------------------------------


@pytest.mark.net
@pytest.mark.timeout(240)
def test_run_audit_on_mosquitto_samples_a_big_model_and_inspect_attacks_the_sample(
    tmp_path: Path,
) -> None:
    """`privnet run --audit --audit-sample 1` of a 2-chunk model (u4) on mosquitto: the tap
    kept one chunk of each model, summary.json and audit.json say so, the audit finds no clear
    model under local-ghp, every one under none, and residual 0; `inspect --attack` runs on
    the sample (the epsilons say they need whole models)."""
    out = tmp_path / "run"
    exp = privnet.Experiment(
        agents=4, iters=3, strategies="atc", schemes="none,local-ghp", broker="mosquitto",
        problem="mlp", dataset="digits", params={"hidden": [300]}, samples=100, seed=4,
        out=out, audit=True, audit_sample=1,
    )  # fmt: skip
    privnet.run(exp)
    summary = json.loads((out / "summary.json").read_text())
    held = summary["config"]["audit_sample"]
    assert held["sampled"] and held["dim"] == DIM and held["chunk_count"] == 2
    assert len(held["chunks"]) == 1 and 0 < held["recorded_bytes"] < held["payload_bytes"]
    report = json.loads((out / "audit.json").read_text())
    assert report["sample"]["seed"] == held["seed"]
    assert report["sample"]["coordinates"] == held["coordinates"] < DIM
    none, masked = report["sessions"]
    assert none["scheme"] == "none" and none["plaintext_messages"] == none["model_messages"] > 0
    assert masked["plaintext_messages"] == 0 and masked["truth_vs_telemetry"] == 0.0
    assert masked["model_messages"] == masked["expected_model_messages"] > 0
    assert masked["max_cancellation_residual"]["max"] == 0.0
    assert main(["inspect", "--run", str(out), "--attack"]) == 0
    attacked = json.loads((out / "audit.json").read_text())
    assert attacked["reconstruction"]["breaks"] == ["none"]
    assert "local-ghp" in attacked["reconstruction"]["does_not_break"]
    assert all("not on a sample" in row["epsilon"] for row in attacked["adversaries"]["rows"])
