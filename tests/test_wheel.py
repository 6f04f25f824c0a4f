"""privnet installs like a library: build the wheel, install it into a fresh venv outside the
checkout, and run the commands from another directory.

The venv sees this interpreter's site-packages (`--system-site-packages`), so the declared
dependencies resolve from what is installed and nothing is downloaded; privnet itself comes
from the wheel only (the test checks the import path, and scrubs PYTHONPATH). The wheel is
built from a copy of the sources, so the checkout gets no build/ or egg-info.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import venv
from pathlib import Path

import pytest

pytestmark = [pytest.mark.wheel, pytest.mark.timeout(120)]

ROOT = Path(__file__).resolve().parents[1]
SOURCES = ("pyproject.toml", "README.md", "privnet")


def _run(cmd: list[str], cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=90)
    assert done.returncode == 0, f"{' '.join(cmd)} exited {done.returncode}:\n{done.stderr[-3000:]}"
    return done


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, str]]:
    """(bin directory of a venv holding the wheel, an environment without the checkout)."""
    tmp = tmp_path_factory.mktemp("wheel")
    src = tmp / "src"
    for name in SOURCES:
        origin = ROOT / name
        if origin.is_dir():
            shutil.copytree(origin, src / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            src.mkdir(exist_ok=True)
            shutil.copy(origin, src / name)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    dist = tmp / "dist"
    _run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(dist), "."], src, env)
    (wheel,) = dist.glob("privnet-*.whl")
    venv.create(tmp / "venv", system_site_packages=True, with_pip=False)
    bin_dir = tmp / "venv" / "bin"
    pip = [sys.executable, "-m", "pip", "--python", str(bin_dir / "python")]
    _run([*pip, "install", "-q", str(wheel)], tmp, env)
    return bin_dir, {**env, "MPLBACKEND": "Agg"}


def test_wheel_ships_package_data(installed: tuple[Path, dict[str, str]], tmp_path: Path) -> None:
    bin_dir, env = installed
    probe = (
        "import privnet.broker.launcher as b, privnet.orchestrator.experiment.config as c;"
        "import privnet.orchestrator.view.server as v;"
        "print(c.__file__); print(c.presets()); print(len(b.BASE_CONFIG.read_text()));"
        "print(sorted(f.name for f in v.STATIC.iterdir()))"
    )
    out = _run([str(bin_dir / "python"), "-c", probe], tmp_path, env).stdout
    where, presets, conf, page = out.split("\n")[:4]
    assert where.startswith(str(bin_dir.parent)), f"privnet imported from {where}, not the venv"
    assert "paper-regression" in presets
    assert int(conf) > 0
    for name in ("index.html", "view.js", "view.css", "uPlot.iife.min.js", "uPlot-LICENSE.txt"):
        assert name in page  # the live view's page, served offline from the package


def test_reproduce_and_run_from_another_directory(
    installed: tuple[Path, dict[str, str]], tmp_path: Path
) -> None:
    bin_dir, env = installed
    privnet = str(bin_dir / "privnet")
    _run([privnet, "reproduce", "--repeats", "1", "--iters", "50", "--out", "repro"], tmp_path, env)
    summary = json.loads((tmp_path / "repro" / "summary.json").read_text())
    assert summary["config"]["name"] == "paper-regression"
    assert len(summary["results"]) == 15  # 3 strategies x 5 schemes of the shipped preset
    flags = ["--agents", "4", "--iters", "5", "--scheme", "local-ghp", "--out", "net", "--view"]
    _run([privnet, "run", *flags], tmp_path, env)
    (result,) = json.loads((tmp_path / "net" / "summary.json").read_text())["results"]
    assert result["engine"] == "net" and result["bytes"]["model"] > 0
    assert json.loads((tmp_path / "net" / "view.json").read_text())["agents"][3]["round"] == 5
