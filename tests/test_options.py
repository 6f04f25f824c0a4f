"""Every check that relates one option to another lives in the options' types (Experiment,
RunOptions, ExperimentConfig): `privnet run`/`simulate`, which build their Experiment from
their flags, and `privnet.Experiment` refuse the same combinations with the same words, and
both take their defaults from one place."""

from __future__ import annotations

import argparse
from dataclasses import fields
from pathlib import Path
from typing import Any

import pytest

import privnet
from privnet.orchestrator.cli import main, parser
from privnet.orchestrator.engines.options import Restart, RunOptions, Runtime, default

SMALL = ["--agents", "5", "--iters", "5"]
HOSTS = ["--hosts", "hosts.toml"]
U4 = ["--wire-dtype", "u4"]

# (the command and its flags, the same as Experiment's fields, words the refusal says):
# combinations of options, which Experiment (or RunOptions, which it builds) refuses in one
# sentence for both paths; the CLI builds its command's Experiment from its flags
COMBINATIONS: list[tuple[list[str], dict[str, Any], str]] = [
    (["run", "--view-port", "8123"], {"view_port": 8123}, "--view-port (view_port) without"),
    (["run", "--view-host", "0.0.0.0"], {"view_host": "0.0.0.0"}, "--view-host (view_host)"),
    (["run", "--view", "--view-host", " "], {"view": True, "view_host": " "}, "give the address"),
    (
        ["run", "--runtime", "docker", "--tls"],
        {"runtime": "docker", "tls": True},
        "--runtime (runtime) docker starts its own broker",
    ),
    (
        ["run", "--runtime", "swarm", "--broker", "embedded", "--agents-per-process", "2"],
        {"runtime": "swarm", "broker": "embedded", "agents_per_process": 2},
        "drop --broker (broker), --agents-per-process (agents_per_process)",
    ),
    (
        ["run", "--runtime", "docker", "--external-agents"],
        {"runtime": "docker", "external_agents": True},
        "drop --external-agents (external_agents)",
    ),
    (
        ["run", "--image", "privnet:dev"],
        {"image": "privnet:dev"},
        "--image (image) without --runtime (runtime) docker or swarm",
    ),
    (["run", *HOSTS], {"hosts": "hosts.toml"}, "--hosts (hosts) needs the run's secrets"),
    (
        ["run", *HOSTS, "--prepared", "run.json", "--tls", "--audit"],
        {"hosts": "hosts.toml", "prepared": "run.json", "tls": True, "audit": True},
        "--hosts (hosts): drop --tls (tls), --audit (audit)",
    ),
    (
        ["run", *HOSTS, "--prepared", "run.json", "--faults", "kill:1@3"],
        {"hosts": "hosts.toml", "prepared": "run.json", "faults": "kill:1@3"},
        "--hosts (hosts): kill and stop faults need the agents here",
    ),
    (["run", "--faults", "kill:9@3"], {"faults": "kill:9@3"}, "agent 9 is not in [0, 5)"),
    (
        ["run", "--no-telemetry", "--models-every", "4"],
        {"telemetry": False, "models_every": 4},
        "--models-every (models_every) with --no-telemetry",
    ),
    (
        ["run", "--audit-sample", "5"],
        {"audit_sample": 5},
        "--audit-sample (audit_sample) without --audit (audit)",
    ),
    (["run", "--broker", "nowhere"], {"broker": "nowhere"}, "--broker (broker) 'nowhere'"),
    (["run", "--broker", "host:99999"], {"broker": "host:99999"}, "bad broker address"),
    (
        ["run", *U4, "--topology", "one-peer-exponential"],
        {"wire_dtype": "u4", "topology": "one-peer-exponential"},
        "a time-varying topology runs on the f8 wire",
    ),
    (
        ["run", *U4, "--byzantine", "1:sign-flip"],
        {"wire_dtype": "u4", "byzantine": "1:sign-flip"},
        "byzantine agents with wire_dtype u4",
    ),
    (
        ["simulate", *U4, "--byzantine", "1:sign-flip"],
        {"wire_dtype": "u4", "byzantine": "1:sign-flip"},
        "byzantine agents with wire_dtype u4",
    ),
    (
        ["run", "--account", "--neighbour-agent", "7"],
        {"account": True, "neighbour": 7},
        "--neighbour-agent (neighbour) 7: give an agent of 0..4",
    ),
    (
        ["simulate", "--account", "--neighbour-agent", "5"],
        {"account": True, "neighbour": 5},
        "--neighbour-agent (neighbour) 5: give an agent of 0..4",
    ),
    (
        ["simulate", "--membership", "membership.json"],
        {"membership": "membership.json"},
        "--membership (membership) replays on the memory engine: add --engine (engine) memory",
    ),
]
# single values out of their range or choices: argparse refuses them on the command line
# (naming the flag), the options' types in the library
VALUES: list[tuple[list[str], dict[str, Any], str]] = [
    (["run", "--restart", "always"], {"restart": "always"}, "choose one of never, on-failure"),
    (["run", "--runtime", "k8s"], {"runtime": "k8s"}, "choose one of local, docker, swarm"),
    (["run", "--agents-per-process", "0"], {"agents_per_process": 0}, "agents-per-process"),
    (["run", "--deadline", "0"], {"deadline": 0.0}, "deadline"),
    (["run", "--checkpoint-every", "-1"], {"checkpoint_every": -1}, "checkpoint-every"),
    (["run", "--audit", "--audit-sample", "0"], {"audit": True, "audit_sample": 0}, "audit-sample"),
    (["simulate", "--engine", "warp"], {"engine": "warp"}, "choose one of oracle, memory"),
    (["run", "--local-steps", "0"], {"local_steps": 0}, "must be an integer >= 1"),
    (["simulate", "--local-steps", "-2"], {"local_steps": -2}, "local gradient steps"),
]


def library_refusal(options: dict[str, Any]) -> str:
    with pytest.raises(privnet.ConfigError) as refused:
        privnet.Experiment(agents=5, iters=5, **options)
    return str(refused.value)


def cli_refusal(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    command, *flags = argv
    try:
        code = main([command, *SMALL, *flags])
    except SystemExit as exc:  # argparse's own refusals (a choice, a range)
        code = exc.code  # type: ignore[assignment]
    assert code == 2
    return " ".join(capsys.readouterr().err.split())


@pytest.mark.parametrize(("argv", "options", "words"), COMBINATIONS)
def test_the_cli_and_the_library_refuse_alike(
    argv: list[str],
    options: dict[str, Any],
    words: str,
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.chdir(tmp_path)  # nothing may be written; if it were, here
    said = library_refusal(options)
    assert words in said
    assert said in cli_refusal(argv, capsys)  # the very sentence, not a paraphrase


@pytest.mark.parametrize(("argv", "options", "words"), VALUES)
def test_a_bad_value_is_refused_both_ways(
    argv: list[str], options: dict[str, Any], words: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert words in library_refusal(options)
    assert argv[1] in cli_refusal(argv, capsys)  # the flag named


def test_the_same_options_pass_both_ways(tmp_path: Path) -> None:
    """What both accept becomes the same RunOptions."""
    flags = ["--runtime", "docker", "--restart", "on-failure", "--checkpoint-every", "5"]
    args = parser().parse_args(["run", *SMALL, *flags])
    from privnet.orchestrator.commands.run import run_experiment
    from privnet.orchestrator.experiment.config import ExperimentConfig

    from_cli = run_experiment(args, ExperimentConfig(agents=5, iters=5)).run_options()
    exp = privnet.Experiment(
        agents=5, iters=5, runtime="docker", restart="on-failure", checkpoint_every=5
    )
    assert from_cli == exp.run_options()
    assert from_cli.runtime is Runtime.DOCKER and from_cli.restart is Restart.ON_FAILURE


def test_every_default_is_named_once() -> None:
    """The CLI's flags and Experiment's fields give RunOptions' defaults."""
    args = parser().parse_args(["run"])
    exp = privnet.Experiment()
    for field in fields(RunOptions):
        if field.name in ("neighbour", "secret_seed"):
            continue
        assert getattr(exp, field.name) == field.default, field.name
        cli = getattr(args, field.name, argparse.SUPPRESS)
        if cli is not argparse.SUPPRESS and field.name not in ("telemetry",):
            assert cli == field.default, field.name
    assert default("checkpoint_every") == RunOptions().checkpoint_every == 25


def test_simulate_refuses_an_engine_as_the_experiment_does() -> None:
    """`privnet.simulate(exp, engine=...)` checks the engine as Experiment's field."""
    exp = privnet.Experiment(agents=5, iters=5, engine="memory", membership="m.json")
    with pytest.raises(privnet.ConfigError) as refused:
        privnet.simulate(exp, engine="oracle")
    assert str(refused.value) == library_refusal({"membership": "m.json"})


def test_the_experiments_own_defaults_are_the_clis() -> None:
    """simulate's --engine and --neighbour-agent take Experiment's defaults."""
    from privnet.orchestrator.api import Engine, experiment_default

    args = parser().parse_args(["simulate"])
    assert args.engine == experiment_default("engine") == privnet.Experiment().engine
    assert args.engine is not None and Engine(args.engine) is Engine.ORACLE
    assert args.neighbour == experiment_default("neighbour") == privnet.Experiment().neighbour


def test_local_steps_take_one_default_both_ways() -> None:
    """--local-steps (issue 29): the CLI's flag and Experiment's field give the same E, and
    both default to spec.LOCAL_STEPS, the paper's one step."""
    from privnet.agent.spec import LOCAL_STEPS
    from privnet.orchestrator.commands.experiment import experiment

    assert LOCAL_STEPS == 1 == privnet.Experiment().local_steps
    assert experiment(parser().parse_args(["simulate"])).local_steps == LOCAL_STEPS
    given = experiment(parser().parse_args(["run", *SMALL, "--local-steps", "3"]))
    assert given.local_steps == privnet.Experiment(local_steps=3).local_steps == 3
