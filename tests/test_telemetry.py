"""Telemetry that does not need every model every round (issue 29, item 3): each agent's
own metrics every round, its true model every K rounds and the last, a model too big for
one message in Parts; what the orchestrator makes of them, in memory and over a broker."""

import csv
import math
from pathlib import Path

import numpy as np
import pytest

from privnet.agent import datasets, keys, problems, wire
from privnet.agent.control import Telemetry
from privnet.agent.losses import SCORE_BUDGET, SCORE_FLOOR, SCORE_ROWS, make_loss, score_rows
from privnet.agent.messages import METRIC_COUNT, Metrics, Part, Reason, Rejected, Report
from privnet.agent.protocol import telemetry_context
from privnet.agent.spec import Scheme, Strategy
from privnet.orchestrator.cli import main
from privnet.orchestrator.conductor import pacing
from privnet.orchestrator.conductor.collection import Collection, model_round
from privnet.orchestrator.curves import ROUNDS_SUFFIX, expand_models
from privnet.orchestrator.engines import journal
from privnet.orchestrator.engines.memory import Network
from privnet.orchestrator.experiment.config import ExperimentConfig
from privnet.orchestrator.experiment.instance import Instance
from privnet.orchestrator.experiment.specs import session_plans

RUN = "telemetry-unit"
ORCHESTRATOR = keys.Identity.generate()

# ---- the wire ---------------------------------------------------------------------------------


def test_a_batch_of_reports_alone_is_the_pinned_report_batch() -> None:
    reports = [Report(5, r, np.array([1.0, -0.0, r])) for r in (1, 2)]
    assert wire.encode_telemetry(list(reports)) == wire.encode_reports(reports)


def test_metrics_carry_nan_and_inf_and_parts_lie_in_the_model() -> None:
    told = wire.metrics(2, 7, (math.inf, math.nan))
    big = Report(2, 7, np.arange(300_000, dtype=float))
    parts = wire.split(big)
    assert [p.offset for p in parts] == [0, wire.part_dim(), 2 * wire.part_dim()]
    assert all(isinstance(p, Part) for p in parts) and len(parts) == wire.part_count(300_000)
    back = wire.decode_telemetry(wire.encode_telemetry([told, *parts[:1]]), 300_000)
    assert isinstance(back[0], Metrics) and back[0].round == 7
    values = wire.metric_values(back[0])
    assert values[0] == math.inf and math.isnan(values[1])
    assert np.array_equal(np.concatenate([p.w for p in parts]), big.w)
    shifted = Part(2, 7, 5, np.zeros(wire.part_dim()))  # not on a part's boundary
    with pytest.raises(Rejected) as exc:
        wire.decode_telemetry(wire.encode_telemetry([shifted]), 300_000)
    assert exc.value.reason is Reason.SCHEMA
    with pytest.raises(Rejected):  # a part of a model that travels whole
        wire.decode_telemetry(wire.encode_telemetry([Part(2, 7, 0, np.zeros(3))]), 3)


@pytest.mark.parametrize("dim", [10, 50_000, wire.max_report_dim(), 1_000_000])
def test_every_telemetry_message_fits_the_control_limit(dim: int) -> None:
    items = [wire.metrics(0, r, (1.0, 2.0)) for r in range(1, 11)]
    items += wire.split(Report(0, 10, np.ones(dim)))
    batches = wire.pack_items(items)
    assert [i for b in batches for i in b] == items  # in order, each once
    sealed_overhead = 2048  # signature, seal, envelope: TELEMETRY_OVERHEAD
    for batch in batches:
        assert len(wire.encode_telemetry(batch)) + sealed_overhead <= wire.MAX_CONTROL_BYTES
    assert len(batches) == (1 if dim <= 50_000 else wire.part_count(dim) + 1)  # + the metrics


def test_the_default_k_is_one_up_to_one_message_then_the_messages_a_model_takes() -> None:
    assert wire.default_models_every(10) == wire.default_models_every(wire.max_report_dim()) == 1
    assert wire.default_models_every(wire.max_report_dim() + 1) == 2
    assert wire.default_models_every(1_000_000) == 8  # 1M float64: 8 messages of 1 MiB


def test_a_float32_problems_parts_travel_as_float32_and_nothing_else_does() -> None:
    """wire.telemetry_dtype: <f4 Parts for a float32 problem's model too big for one
    message (half the bytes, half the messages), <f8 for a float64 problem's and for any
    model of one Report; a receiver expecting one refuses the other, and a non-finite one."""
    dim = 1_000_000
    assert wire.telemetry_dtype(dim, True) == wire.F4
    assert wire.telemetry_dtype(dim, False) == wire.DTYPE  # the paper's float64 problems
    assert wire.telemetry_dtype(wire.max_report_dim(), True) == wire.DTYPE  # one Report
    assert wire.part_count(dim, wire.F4) == 4 and wire.part_count(dim) == 8
    assert wire.default_models_every(dim) == 8  # K counts float64 Parts whatever the dtype
    w = np.random.default_rng(2).standard_normal(dim)
    parts = wire.split(Report(3, 8, w), wire.F4)
    assert [p.offset for p in parts] == [i * wire.part_dim(wire.F4) for i in range(4)]
    assert all(isinstance(p, Part) and p.w.dtype == np.float32 for p in parts)
    blob = wire.encode_telemetry(parts[:1])
    assert len(blob) < 4 * wire.part_dim(wire.F4) + 200  # 4 bytes a parameter
    (back,) = wire.decode_telemetry(blob, dim, wire.F4)
    assert isinstance(back, Part) and back.w.dtype == np.float32
    assert np.array_equal(back.w, w[: len(back.w)].astype(np.float32))
    with pytest.raises(Rejected) as wide:  # float64 where float32 is expected
        wire.decode_telemetry(wire.encode_telemetry(wire.split(Report(3, 8, w))[:1]), dim, wire.F4)
    assert wide.value.reason is Reason.SHAPE
    with pytest.raises(Rejected) as narrow:  # and the other way round
        wire.decode_telemetry(blob, dim)
    assert narrow.value.reason is Reason.SHAPE
    bad = np.ones(wire.part_dim(wire.F4), dtype=np.float32)
    bad[7] = np.inf
    with pytest.raises(Rejected) as infinite:
        wire.decode_telemetry(wire.encode_telemetry([Part(3, 8, 0, bad)]), dim, wire.F4)
    assert infinite.value.reason is Reason.NON_FINITE and "[7]" in infinite.value.detail
    assert np.array_equal(wire.as_telemetered(w, wire.F4), w.astype(np.float32))
    assert wire.as_telemetered(w, wire.DTYPE) is w


# ---- the orchestrator's collection ------------------------------------------------------------


def _sealed(agent: int, items: list, last: int) -> Telemetry:
    context = telemetry_context(RUN, agent, 0, 0, last)
    blob = keys.seal(ORCHESTRATOR.public.static, wire.encode_telemetry(items), context)
    return Telemetry(agent, 0, 0, last, blob)


def test_a_round_is_in_with_its_metrics_and_at_a_model_round_its_whole_model() -> None:
    dim, rounds = 300_000, 4
    collection = Collection(RUN, ORCHESTRATOR)
    collection.new_session(rounds, 2, dim, every=2)
    assert [model_round(r, 2, rounds) for r in (1, 2, 3, 4)] == [False, True, False, True]
    w = np.random.default_rng(1).standard_normal(dim)
    parts = wire.split(Report(1, 2, w))
    told = [wire.metrics(1, r, (0.5 * r, 0.1)) for r in (1, 2)]
    collection.telemetry(_sealed(1, told, 2), 0, dim, rounds)
    assert collection.done[:, 1].tolist() == [True, False, False, False]  # round 2: no model
    collection.telemetry(_sealed(1, parts[:2], 2), 0, dim, rounds)
    assert not collection.done[1, 1] and np.isnan(collection.models[1, 1, 0])
    with pytest.raises(Rejected) as again:  # a part twice
        collection.telemetry(_sealed(1, parts[1:], 2), 0, dim, rounds)
    assert again.value.reason is Reason.DUPLICATE
    collection.telemetry(_sealed(1, parts[2:], 2), 0, dim, rounds)
    assert collection.done[1, 1] and collection.counts.tolist() == [0, 2]
    assert np.array_equal(collection.models[1, 1], w)
    assert collection.metrics[:2, 1, 0].tolist() == [0.5, 1.0]
    with pytest.raises(Rejected) as late:  # past its view's end
        collection.telemetry(_sealed(1, [wire.metrics(1, 3, (0.0, 0.0))], 3), 0, dim, 2)
    assert late.value.reason is Reason.STALE_VIEW
    collection.redo(2)
    assert collection.counts.tolist() == [0, 1] and np.isnan(collection.models[1, 1, 0])


def test_float32_parts_go_straight_into_the_slot_and_an_unfinished_model_is_none() -> None:
    """<f4 Parts, in any order, written in place: the slot's column 0 stays NaN (no model)
    until the last part is in; a model whose parts did not all come by the session's end
    is blanked again (`unfinished`)."""
    dim, rounds = 600_000, 2
    collection = Collection(RUN, ORCHESTRATOR)
    collection.new_session(rounds, 2, dim, every=1, dtype=wire.F4)
    w = np.random.default_rng(3).standard_normal(dim)
    parts = wire.split(Report(0, 1, w), wire.F4)
    assert len(parts) == 3
    for part in reversed(parts):
        assert np.isnan(collection.models[0, 0, 0]) and not collection.done[0, 0]
        collection.telemetry(_sealed(0, [part], 1), 0, dim, rounds)
    collection.telemetry(_sealed(0, [wire.metrics(0, 1, (1.0, 2.0))], 1), 0, dim, rounds)
    assert collection.done[0, 0] and not collection.pieces
    assert np.array_equal(collection.models[0, 0], w.astype(np.float32))
    other = wire.split(Report(1, 2, w), wire.F4)
    collection.telemetry(_sealed(1, other[:1], 2), 0, dim, rounds)
    assert np.isnan(collection.models[1, 1, 0]) and collection.models[1, 1, 1] == np.float32(w[1])
    collection.unfinished()
    assert not collection.pieces and np.isnan(collection.models[1, 1]).all()
    assert np.array_equal(collection.models[0, 0], w.astype(np.float32))  # a whole one stays


def test_the_journal_keeps_float32_models_as_float32_and_reads_every_record_back(
    tmp_path: Path,
) -> None:
    """A round record's flag says what follows: nothing, <f8 models or <f4 ones (a float32
    problem's, whose telemetry carried float32: the same values at half the bytes); a
    resumed run reads each back as it was written, and a record a kill cut short is none."""
    agents, dim = 2, 5
    (tmp_path / "journal").mkdir()
    rng = np.random.default_rng(4)
    wide, narrow = rng.standard_normal((agents, dim)), rng.standard_normal((agents, dim))
    narrow = narrow.astype(np.float32)
    metrics = rng.standard_normal((3, agents, METRIC_COUNT))
    journal.rounds(tmp_path, 0, [wide, None, narrow], metrics)
    path = tmp_path / "journal" / "rounds-0.bin"
    head = 8 * (1 + agents * METRIC_COUNT)
    assert path.stat().st_size == 3 * head + 8 * agents * dim + 4 * agents * dim
    config = ExperimentConfig(agents=agents, iters=4, dim=dim)
    point = journal.resume_point(config, 0, path)
    assert point.recorded == 3 and np.array_equal(point.metrics[:3], metrics)
    assert np.array_equal(point.models[0], wide) and np.isnan(point.models[1]).all()
    assert point.models[2].dtype == np.float64 and np.array_equal(point.models[2], narrow)
    with path.open("ab") as fh:  # a fourth record the kill cut short
        fh.write(np.float64(2).tobytes() + bytes(head))
    assert journal.resume_point(config, 0, path).recorded == 3


def test_a_sparse_session_is_made_whole_with_nan_between_its_model_rounds() -> None:
    held = {"a/b/0": np.ones((2, 3, 4)), "a/b/0" + ROUNDS_SUFFIX: np.array([3, 6])}
    whole = expand_models(held)["a/b/0"]
    assert whole.shape == (6, 3, 4)
    assert np.isnan(whole[[0, 1, 3, 4], :, 0]).all() and (whole[[2, 5]] == 1).all()


# ---- the agents' own metrics ------------------------------------------------------------------


def test_a_big_model_is_scored_on_fewer_rows_within_the_budget() -> None:
    assert score_rows(31) == SCORE_ROWS  # small models: every row they always had
    assert score_rows(SCORE_BUDGET // SCORE_ROWS) == SCORE_ROWS
    assert score_rows(1_000_000) == 67 and SCORE_BUDGET >= 67 * 1_000_000
    assert score_rows(1_690_022) == 39
    assert score_rows(10**9) == SCORE_FLOOR  # never fewer than the floor


def test_an_agent_scores_its_minibatch_and_its_held_out_rows() -> None:
    config = ExperimentConfig(agents=3, iters=5, problem="logistic", dataset="breast-cancer")
    problem = Instance.build(config)
    share = problem.specs(0)[1]
    loss = make_loss(share)
    w = np.random.default_rng(2).standard_normal(problem.config.dim) * 0.1
    minibatch, score = loss.metrics(w, 3)
    assert minibatch == pytest.approx(float(loss.risk.value(w[None], None)[0]))  # full batch
    held_out = min(score_rows(problem.config.dim), len(datasets.load("breast-cancer").y_test))
    assert 0.0 <= score <= 1.0 and abs(score * held_out - round(score * held_out)) < 1e-9
    regression = Instance.build(ExperimentConfig(agents=3, iters=5, batch=4))
    local = make_loss(regression.specs(0)[0])
    v = np.ones(regression.config.dim)
    batch_loss, risk = local.metrics(v, 2)
    rows = problems.minibatch(local.batch, local.batch_key, local.samples, 2)
    assert rows is not None
    assert batch_loss == pytest.approx(float(local.risk.value(v[None], rows)[0]))
    assert risk == pytest.approx(float(local.risk.value(v[None], None)[0]))
    assert batch_loss != risk


# ---- memory engine: models every K, metrics every round ---------------------------------------


def test_models_every_k_are_the_every_round_models_at_those_rounds() -> None:
    problem = Instance.build(ExperimentConfig(agents=6, iters=11, seed=3))
    plans = session_plans(problem, [(Strategy.ATC, Scheme.LOCAL_GHP, 0)])
    (every,) = Network.build(plans).play()
    (sparse,) = Network.build(plans, models_every=4).play()
    assert every.models_every == 1 and sparse.models_every == 4
    held = [r - 1 for r in range(1, 12) if r % 4 == 0 or r == 11]
    assert held == [3, 7, 10]
    assert np.array_equal(sparse.models[held], every.models[held])
    others = [r for r in range(11) if r not in held]
    assert np.isnan(sparse.models[others]).all()
    assert every.metrics is not None and sparse.metrics is not None
    assert np.array_equal(sparse.metrics, every.metrics) and not np.isnan(every.metrics).any()
    assert sparse.missed == {} and every.missed == {}


def test_agents_forget_the_models_of_rounds_the_conductor_recorded(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A Recorded once every member's reports of a round are in (every round here, as for
    a 1M-parameter model): each agent ends holding its last model only, and the run is the
    one whose agents kept them all (a 6-agent model keeps every one)."""
    problem = Instance.build(ExperimentConfig(agents=6, iters=11, seed=3))
    plans = session_plans(problem, [(Strategy.ATC, Scheme.LOCAL_GHP, 0)])
    kept = Network.build(plans)
    (whole,) = kept.play()
    assert all(n.session and sorted(n.session.history) == list(range(12)) for n in kept.nodes)
    monkeypatch.setattr(pacing, "RECORDED_BYTES", 8 * plans[0].dim)  # a Recorded every round
    pruned = Network.build(plans)
    (same,) = pruned.play()
    assert np.array_equal(same.models, whole.models)
    assert all(n.session and sorted(n.session.history) == [11] for n in pruned.nodes)


# ---- over a real broker -----------------------------------------------------------------------


def _rows(path: Path) -> list[dict[str, str]]:
    with path.open(newline="") as fh:
        return list(csv.DictReader(fh))


@pytest.mark.net
def test_a_run_sends_metrics_every_round_and_models_every_k(
    needs_mosquitto: None, tmp_path: Path
) -> None:
    flags = ["--agents", "6", "--iters", "14", "--seed", "9", "--strategy", "atc"]
    flags += ["--scheme", "none,local-ghp"]
    net, memory = tmp_path / "net", tmp_path / "memory"
    argv = ["run", *flags, "--models-every", "5", "--broker", "mosquitto", "--out", str(net)]
    assert main(argv) == 0
    assert main(["simulate", "--engine", "memory", *flags, "--out", str(memory)]) == 0
    ran, replayed = _rows(net / "metrics.csv"), _rows(memory / "metrics.csv")
    assert len(ran) == len(replayed) == 2 * 14
    held = {5, 10, 14}
    for a, b in zip(ran, replayed, strict=True):
        assert (a["scheme"], a["iter"]) == (b["scheme"], b["iter"])
        for name in ("loss_agents", "risk_agents"):  # every round, the same as in memory
            assert float(a[name]) == pytest.approx(float(b[name]), rel=1e-12), name
        if int(a["iter"]) in held:
            assert float(a["msd_centroid"]) == pytest.approx(float(b["msd_centroid"]), rel=1e-9)
        else:
            assert math.isnan(float(a["msd_centroid"])) and math.isnan(float(a["msd_avg"]))
    with np.load(net / "models.npz") as saved:
        models = expand_models({k: saved[k] for k in saved.files})
        assert saved[f"atc/local-ghp/0{ROUNDS_SUFFIX}"].tolist() == sorted(held)
    import privnet

    exp = privnet.Experiment(agents=6, iters=14, seed=9, strategies="atc", schemes="none,local-ghp")
    truth = privnet.simulate(exp, "memory").models
    for label, whole in models.items():
        rounds = [r - 1 for r in sorted(held)]
        np.testing.assert_array_equal(whole[rounds], truth[label][rounds], err_msg=label)
    result = privnet.Result.load(net)
    assert {"loss_agents", "risk_agents", "msd_centroid"} <= set(result.names)


def test_a_k_below_one_is_refused_naming_the_flag() -> None:
    import privnet
    from privnet.agent.spec import ConfigError

    with pytest.raises(ConfigError, match=r"--models-every \(models_every\) must be >= 1"):
        privnet.Experiment(agents=3, iters=4, models_every=0)
    with pytest.raises(SystemExit):
        main(["run", "--agents", "3", "--models-every", "0"])
