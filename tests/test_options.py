"""The run options' checks live in RunOptions: `privnet run` and `privnet.Experiment` refuse
the same combinations with the same words, and both take their defaults from one place."""

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

# (the flags of `privnet run`, the same as Experiment's fields, words the refusal says):
# combinations of options, which RunOptions refuses in one sentence for both paths
COMBINATIONS: list[tuple[list[str], dict[str, Any], str]] = [
    (["--view-port", "8123"], {"view_port": 8123}, "--view-port (view_port) without --view"),
    (["--view-host", "0.0.0.0"], {"view_host": "0.0.0.0"}, "--view-host (view_host) without"),
    (["--view", "--view-host", " "], {"view": True, "view_host": " "}, "give the address"),
    (
        ["--runtime", "docker", "--tls"],
        {"runtime": "docker", "tls": True},
        "--runtime (runtime) docker starts its own broker",
    ),
    (
        ["--runtime", "swarm", "--broker", "embedded", "--agents-per-process", "2"],
        {"runtime": "swarm", "broker": "embedded", "agents_per_process": 2},
        "drop --broker (broker), --agents-per-process (agents_per_process)",
    ),
    (
        ["--runtime", "docker", "--external-agents"],
        {"runtime": "docker", "external_agents": True},
        "drop --external-agents (external_agents)",
    ),
]
# single values out of their range or choices: argparse refuses them on the command line
# (naming the flag), RunOptions in the library
VALUES: list[tuple[list[str], dict[str, Any], str]] = [
    (["--restart", "always"], {"restart": "always"}, "choose one of never, on-failure"),
    (["--runtime", "k8s"], {"runtime": "k8s"}, "choose one of local, docker, swarm"),
    (["--agents-per-process", "0"], {"agents_per_process": 0}, "agents-per-process"),
    (["--deadline", "0"], {"deadline": 0.0}, "deadline"),
    (["--checkpoint-every", "-1"], {"checkpoint_every": -1}, "checkpoint-every"),
]


def library_refusal(options: dict[str, Any]) -> str:
    with pytest.raises(privnet.ConfigError) as refused:
        privnet.Experiment(agents=5, iters=5, **options)
    return str(refused.value)


def cli_refusal(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    try:
        code = main(["run", *SMALL, *argv])
    except SystemExit as exc:  # argparse's own refusals (a choice, a range)
        code = exc.code  # type: ignore[assignment]
    assert code == 2
    return " ".join(capsys.readouterr().err.split())


@pytest.mark.parametrize(("argv", "options", "words"), COMBINATIONS)
def test_the_cli_and_the_library_refuse_alike(
    argv: list[str], options: dict[str, Any], words: str, capsys: pytest.CaptureFixture[str]
) -> None:
    said = library_refusal(options)
    assert words in said
    assert said in cli_refusal(argv, capsys)  # the very sentence, not a paraphrase


@pytest.mark.parametrize(("argv", "options", "words"), VALUES)
def test_a_bad_value_is_refused_both_ways(
    argv: list[str], options: dict[str, Any], words: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert words in library_refusal(options)
    assert argv[0] in cli_refusal(argv, capsys)  # the flag named


def test_the_same_options_pass_both_ways(tmp_path: Path) -> None:
    """What both accept becomes the same RunOptions."""
    flags = ["--runtime", "docker", "--restart", "on-failure", "--checkpoint-every", "5"]
    args = parser().parse_args(["run", *SMALL, *flags])
    from privnet.orchestrator.commands.run import run_options

    args.secret_seed = False
    from_cli = run_options(args)
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
