"""`--config` takes a TOML file or the name of a preset shipped as package data."""

from pathlib import Path

import pytest

from agent.spec import ConfigError
from orchestrator.experiment import config


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
