"""A module of the user's named agent.py (or broker.py, orchestrator.py) in the working
directory, where Python looks first, is simply the user's: privnet installs one import name
(`privnet`) and its parts live under it, so neither `import privnet` in a script nor
`python -m privnet run` and its agent processes meet the user's modules."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from conftest import need_mosquitto

from privnet.orchestrator.cli import main

ROOT = Path(__file__).resolve().parent.parent
# A user's module that would break privnet if privnet ever ran it in place of its own.
USERS = "raise SystemExit('the user module {name}.py ran in place of privnet')\n"


def beside(tmp_path: Path) -> dict[str, str]:
    """The user's agent.py, broker.py and orchestrator.py in tmp_path; the environment to
    run privnet there."""
    for name in ("agent", "broker", "orchestrator"):
        (tmp_path / f"{name}.py").write_text(USERS.format(name=name))
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)
    return {**os.environ, "PYTHONPATH": path}  # `python -c` and `-m` put the cwd before it


def test_import_privnet_beside_a_users_agent_py(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = (  # privnet imports none of them; `import agent` would find the user's
        "import importlib.util, sys, privnet\n"
        "assert not {'agent', 'broker', 'orchestrator'} & set(sys.modules)\n"
        "names = ('agent', 'broker', 'orchestrator')\n"
        "print(privnet.__version__, *(importlib.util.find_spec(n).origin for n in names))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        cwd=tmp_path,
        env=beside(tmp_path),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    version, *files = done.stdout.split()
    with pytest.raises(SystemExit) as done_cli:  # `privnet --version`, in this process
        main(["--version"])
    assert done_cli.value.code == 0 and capsys.readouterr().out == f"privnet {version}\n"
    assert [Path(f) for f in files] == [
        tmp_path / f"{name}.py" for name in ("agent", "broker", "orchestrator")
    ]


def test_privnet_run_beside_a_users_agent_py(tmp_path: Path) -> None:
    need_mosquitto()
    flags = ["--agents", "3", "--iters", "3", "--strategy", "atc", "--scheme", "local-ghp"]
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "privnet",
            "run",
            *flags,
            "--broker",
            "mosquitto",
            "--out",
            "out",
            "--seed",
            "1",
        ],
        cwd=tmp_path,
        env=beside(tmp_path),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    (record,) = json.loads((tmp_path / "out" / "summary.json").read_text())["results"]
    assert record["scheme"] == "local-ghp"
    logs = "".join(p.read_text() for p in (tmp_path / "out" / "logs").glob("*.log"))
    assert "in place of privnet" not in logs + done.stderr


def test_the_console_script_enters_through_privnet() -> None:
    """`privnet` enters through the one package, like `python -m privnet`."""
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts == {"privnet": "privnet.__main__:main"}
