"""privnet installs like a library: `python -m build` makes an sdist and a wheel (from the
sdist) that `twine check` passes; the wheel adds one import name, `privnet`; each installs
into a fresh venv outside the checkout, where the commands and a fast part of the suite
(shipped in the sdist) run.

The venvs see this interpreter's site-packages (`--system-site-packages`), so the declared
dependencies resolve from what is installed and nothing is downloaded; privnet itself comes
from the wheel or the sdist only (the test checks the import path, and scrubs PYTHONPATH).
Both are built from a copy of the sources, so the checkout gets no build/ or egg-info; the
copy has no .git, so the version setuptools-scm reads from the checkout is passed to the
build as SETUPTOOLS_SCM_PRETEND_VERSION (as the Dockerfile's PRIVNET_VERSION does).
"""

from __future__ import annotations

import csv
import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
import venv
import zipfile
from pathlib import Path

import pytest

pytestmark = [pytest.mark.wheel, pytest.mark.timeout(180)]

ROOT = Path(__file__).resolve().parents[1]
SOURCES = ("pyproject.toml", "README.md", "CHANGELOG.md", "MANIFEST.in", "privnet", "tests")
# Pure unit tests, run against the installed sdist: the wire codec, keys, the agents' core.
FAST = ("tests/test_wire.py", "tests/test_keys.py", "tests/test_core.py")


def _run(cmd: list[str], cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=120)
    said = (done.stderr or done.stdout)[-3000:]
    assert done.returncode == 0, f"{' '.join(cmd)} exited {done.returncode}:\n{said}"
    return done


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, str]:
    """(sdist, wheel, version): `python -m build` on a copy of the sources, the wheel made
    from the sdist, with the version setuptools-scm reads from the checkout's git."""
    tmp = tmp_path_factory.mktemp("dist")
    src = tmp / "src"
    for name in SOURCES:
        origin = ROOT / name
        if origin.is_dir():
            ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
            shutil.copytree(origin, src / name, ignore=ignore)
        else:
            src.mkdir(exist_ok=True)
            shutil.copy(origin, src / name)
    scm = [sys.executable, "-m", "setuptools_scm", "--root", str(ROOT)]
    scm += ["--config", str(ROOT / "pyproject.toml")]  # as the build reads it
    version = _run(scm, ROOT, _clean_env()).stdout.strip()
    env = {**_clean_env(), "SETUPTOOLS_SCM_PRETEND_VERSION": version}
    # --no-isolation: the build backend (setuptools, setuptools-scm) as installed, no download
    _run([sys.executable, "-m", "build", "--no-isolation", "-o", str(tmp / "dist")], src, env)
    (sdist,) = (tmp / "dist").glob("privnet-*.tar.gz")
    (wheel,) = (tmp / "dist").glob("privnet-*.whl")
    return sdist, wheel, version


def _clean_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k != "PYTHONPATH"} | {"MPLBACKEND": "Agg"}


def _venv(where: Path, package: Path) -> Path:
    """A fresh venv (seeing the installed dependencies) holding `package`; its bin/."""
    venv.create(where, system_site_packages=True, with_pip=False)
    pip = [sys.executable, "-m", "pip", "--python", str(where / "bin" / "python")]
    flags = ["install", "-q", "--no-deps", "--no-build-isolation", str(package)]
    _run([*pip, *flags], where.parent, _clean_env())
    return where / "bin"


@pytest.fixture(scope="module")
def installed(
    built: tuple[Path, Path, str], tmp_path_factory: pytest.TempPathFactory
) -> tuple[Path, dict[str, str]]:
    """(bin directory of a venv holding the wheel, an environment without the checkout)."""
    return _venv(tmp_path_factory.mktemp("wheel") / "venv", built[1]), _clean_env()


def test_twine_checks_the_sdist_and_the_wheel(built: tuple[Path, Path, str]) -> None:
    sdist, wheel, version = built
    assert wheel.name == f"privnet-{version}-py3-none-any.whl"
    done = _run(
        [sys.executable, "-m", "twine", "check", "--strict", str(sdist), str(wheel)],
        ROOT,
        _clean_env(),
    )
    assert done.stdout.count("PASSED") == 2, done.stdout


def test_the_wheel_adds_one_import_name(built: tuple[Path, Path, str]) -> None:
    _, wheel, version = built
    with zipfile.ZipFile(wheel) as archive:
        record = archive.read(f"privnet-{version}.dist-info/RECORD").decode()
    tops = {Path(row[0]).parts[0] for row in csv.reader(io.StringIO(record)) if row}
    assert tops == {"privnet", f"privnet-{version}.dist-info"}


def test_the_sdist_installs_and_passes_the_fast_suite(
    built: tuple[Path, Path, str], tmp_path: Path
) -> None:
    sdist, _, version = built
    with tarfile.open(sdist) as archive:
        archive.extractall(tmp_path / "unpacked", filter="data")
    unpacked = tmp_path / "unpacked" / f"privnet-{version}"
    assert (unpacked / "CHANGELOG.md").is_file() and (unpacked / "tests" / "conftest.py").is_file()
    bin_dir = _venv(tmp_path / "venv", sdist)
    suite = tmp_path / "suite"  # the sdist's tests and pytest settings, and no privnet/ beside
    shutil.copytree(unpacked / "tests", suite / "tests")
    shutil.copy(unpacked / "pyproject.toml", suite / "pyproject.toml")
    python = str(bin_dir / "python")
    probe = "import privnet; print(privnet.__file__, privnet.__version__)"
    where, said = _run([python, "-c", probe], suite, _clean_env()).stdout.split()
    assert where.startswith(str(tmp_path / "venv")) and said == version
    cmd = [python, "-m", "pytest", "-q", "-p", "no:cacheprovider", *FAST]
    done = _run(cmd, suite, _clean_env())
    assert " passed" in done.stdout and "failed" not in done.stdout, done.stdout[-2000:]


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
