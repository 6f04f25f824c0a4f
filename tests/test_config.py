"""`--config` takes a TOML file or the name of a preset shipped as package data."""

import json
from pathlib import Path

import pytest

from privnet.agent.spec import ConfigError
from privnet.orchestrator.experiment import config


def test_preset_by_name_and_file_by_path(tmp_path: Path) -> None:
    assert "paper-regression" in config.presets()
    preset = config.load("paper-regression")
    assert (preset.name, preset.agents, preset.repeats, preset.iters) == (
        "paper-regression", 30, 20, 1000
    )  # fmt: skip
    assert config.load("paper-regression.toml") == preset
    mine = tmp_path / "mine.toml"
    mine.write_text("[experiment]\nagents = 5\niters = 7\n")
    loaded = config.load(str(mine))
    assert (loaded.name, loaded.agents, loaded.iters) == ("mine", 5, 7)


@pytest.mark.parametrize("source", ["no-such-preset", "missing/file.toml"])
def test_unknown_config_names_the_presets(source: str) -> None:
    with pytest.raises(ConfigError, match=r"neither a TOML file nor a preset.*paper-regression"):
        config.load(source)


def test_bad_toml_says_where(tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text("agents = = 3\n")
    with pytest.raises(ConfigError, match=r"bad\.toml is not valid TOML"):
        config.load(bad)


def test_seal_links_is_on_unless_turned_off(tmp_path: Path) -> None:
    assert config.load(None).seal_links is True
    toml = tmp_path / "visible.toml"
    toml.write_text("seal_links = false\n")
    assert config.load(toml).seal_links is False
    toml.write_text('seal_links = "no"\n')
    with pytest.raises(ConfigError, match="seal_links must be true or false"):
        config.load(toml)


@pytest.mark.parametrize(("flag", "sealed"), [("on", True), ("off", False), ("OFF", False)])
def test_the_seal_links_flag(flag: str, sealed: bool, tmp_path: Path) -> None:
    from privnet.orchestrator.cli import main

    flags = ["--agents", "3", "--iters", "2", "--scheme", "none", "--strategy", "atc"]
    assert (
        main(
            ["simulate", "--engine", "memory", *flags, "--seal-links", flag, "--out", str(tmp_path)]
        )
        == 0
    )
    assert json.loads((tmp_path / "summary.json").read_text())["config"]["seal_links"] is sealed


def test_a_bad_seal_links_flag_says_what_it_takes(capsys: pytest.CaptureFixture[str]) -> None:
    from privnet.orchestrator.cli import main

    with pytest.raises(SystemExit):
        main(["simulate", "--seal-links", "maybe"])
    assert "give on or off" in capsys.readouterr().err
