"""What a new user meets at the command line (issue 22): every wait ends, every mistake is
one line with its fix and exit 2, a run that diverges says so, a reused --out keeps the old
run apart, and `wrote` lists what was written."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from privnet.agent.access import BrokerAddress, ClientAccess
from privnet.agent.spec import ConfigError
from privnet.agent.transport import Connection, CouldNotConnect
from privnet.broker.launcher import free_port
from privnet.orchestrator.cli import main

PRIVNET = [sys.executable, "-m", "privnet.orchestrator.cli"]
SMALL = ["--agents", "5", "--iters", "5"]


def privnet(*argv: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """`privnet ...` as a user runs it: a process, stderr a pipe (not a terminal)."""
    return subprocess.run(
        [*PRIVNET, *argv], capture_output=True, text=True, timeout=timeout, env=os.environ
    )


def one_line(stderr: str) -> str:
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in stderr, stderr[-3000:]
    return lines[0]


# ---- every wait has an end --------------------------------------------------------------


@contextlib.contextmanager
def server(answer: bytes | None) -> Iterator[int]:
    """A TCP server on a free port that accepts, and says `answer` (None: nothing) to each
    client; its port."""
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    held: list[socket.socket] = []
    stop = threading.Event()

    def serve() -> None:
        listener.settimeout(0.1)
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except TimeoutError:
                continue
            held.append(conn)
            if answer is not None:
                with contextlib.suppress(OSError):
                    conn.recv(1024)
                    conn.sendall(answer)
                    conn.close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield port
    finally:
        stop.set()
        thread.join()
        for conn in [*held, listener]:
            conn.close()


HTTP = b"HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"


@pytest.mark.parametrize("answer", [HTTP, None], ids=["http", "silent"])
def test_a_broker_that_is_no_broker_ends_the_run_in_time(
    answer: bytes | None, tmp_path: Path
) -> None:
    """A port that speaks HTTP, or says nothing: one line, exit 2, within twice the
    deadline; the first failed connect says so ("could not connect"), not "lost"."""
    deadline = 3.0
    with server(answer) as port:
        began = time.monotonic()
        flags = ["--broker", f"127.0.0.1:{port}", *SMALL, "--deadline", str(deadline)]
        done = privnet("run", *flags, "--out", str(tmp_path), timeout=60)
        took = time.monotonic() - began
    line = one_line(done.stderr)
    assert done.returncode == 2 and "could not connect" in line and "lost" not in line, line
    assert ("does not speak MQTT" in line) == (answer is not None), line
    assert took < 2 * deadline + 10  # + the interpreter's start on a busy machine
    assert not list(tmp_path.iterdir())  # no journal, no seed: nothing to resume


async def test_the_first_connect_has_its_own_timeout() -> None:
    with server(None) as port:
        began = time.monotonic()
        with pytest.raises(CouldNotConnect, match=r"no answer to CONNECT in 1 s"):
            address = BrokerAddress("127.0.0.1", port)
            async with Connection(address, ClientAccess(), connect_timeout=1.0):
                pass
        assert time.monotonic() - began < 3


# ---- a user's mistake: one line, its fix, exit 2 -------------------------------------------


def mistakes(tmp: Path) -> list[list[str]]:
    """Each a command line the issue met with a traceback (or none of them one line)."""
    (tmp / "twelve.toml").write_text('agents = "twelve"\n')
    (tmp / "huge.toml").write_text("dim = 200000\n")
    (tmp / "a-file").write_text("")
    out = ["--out", str(tmp / "a-file")]
    return [
        ["run", "--broker", f"127.0.0.1:{free_port()}", *SMALL, "--out", str(tmp / "r")],
        ["run", "--broker", "foo:bar", *SMALL],
        ["run", *SMALL, *out],
        ["simulate", *SMALL, *out],
        ["dp-audit", *SMALL, *out],
        ["overhead", "--agents", "4", "--iters", "2", *out],
        ["bench", "--agents", "4", *out],
        ["simulate", "--config", str(tmp / "twelve.toml")],
        ["simulate", "--config", str(tmp / "huge.toml")],
        ["run", "--agents-per-process", "0", *SMALL],
        ["dp-audit", "--trials", "0"],
        ["bench", "--brokers", "rabbitmq"],
        ["run", "--deadline", "-1", *SMALL],
        ["run", "--agnets", "5"],
        ["simulate", "--agents", "5", "--account", "--neighbour-agent", "9"],
    ]


def test_every_mistake_is_one_line_with_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    for argv in mistakes(tmp_path):
        try:
            code = main(argv)
        except SystemExit as exc:  # argparse's errors
            code = exc.code  # type: ignore[assignment]
        err = capsys.readouterr().err
        assert code == 2, (argv, err)
        line = one_line(err)
        assert "error:" in line, (argv, line)
    # A failed run leaves no journal behind: there is nothing to resume from.
    assert not (tmp_path / "r" / "journal").exists()


def test_verbose_adds_the_traceback(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "twelve.toml").write_text('agents = "twelve"\n')
    assert main(["simulate", "--verbose", "--config", str(tmp_path / "twelve.toml")]) == 2
    err = capsys.readouterr().err
    assert "Traceback" in err and "ConfigError" in err
    assert err.strip().splitlines()[-1] == "error: agents = 'twelve': give an integer"


def test_version_and_quiet(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as version:
        main(["--version"])
    assert version.value.code == 0 and capsys.readouterr().out.startswith("privnet 0.")
    assert main(["simulate", *SMALL, "--quiet", "--out", str(tmp_path)]) == 0
    quiet = capsys.readouterr()
    assert quiet.err == "" and "Steady state" in quiet.out  # the results stay


def test_a_run_without_the_docker_sdk_says_what_to_install(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The extra's brackets survive (rich took `[docker]` for markup)."""
    monkeypatch.setitem(sys.modules, "docker", None)  # `import docker` fails: not installed
    assert main(["run", "--runtime", "docker", *SMALL, "--out", str(tmp_path)]) == 2
    assert "pip install 'privnet[docker]'" in one_line(capsys.readouterr().err)


# ---- results that mean nothing say so ---------------------------------------------------


def test_a_diverging_run_says_so_and_fails(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["simulate", "--mu", "100", "--strategy", "atc", "--scheme", "none", *SMALL]
    assert main([*argv, "--iters", "30", "--out", str(tmp_path)]) == 1
    captured = capsys.readouterr()
    assert "diverged" in captured.out and " dB" not in captured.out.split("rounds/s")[-1]
    assert "atc/none diverged" in captured.err and "--mu" in captured.err
    (record,) = json.loads((tmp_path / "summary.json").read_text())["results"]
    assert record["diverged"] is True


def test_a_stable_noisy_run_is_not_called_diverged(tmp_path: Path) -> None:
    argv = ["simulate", "--strategy", "atc", "--scheme", "random", "--sigma-g2", "1", *SMALL]
    assert main([*argv, "--iters", "200", "--out", str(tmp_path)]) == 0


# ---- outputs -----------------------------------------------------------------------------


def test_a_reused_out_keeps_the_earlier_run_apart(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "notes.txt").write_text("mine")
    argv = ["simulate", *SMALL, "--strategy", "atc", "--out", str(tmp_path)]
    assert main([*argv, "--account"]) == 0
    first = (tmp_path / "summary.json").read_text()
    assert main(argv) == 0
    (previous,) = tmp_path.glob("previous-*")
    assert (previous / "summary.json").read_text() == first
    assert (previous / "epsilon.png").exists() and not (tmp_path / "epsilon.png").exists()
    assert (tmp_path / "notes.txt").read_text() == "mine"  # not privnet's: left alone
    assert "held an earlier run" in capsys.readouterr().err


def test_wrote_lists_every_file_written(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["simulate", "--config", "paper-classification", "--agents", "4", "--iters", "3"]
    argv += ["--repeats", "1", "--strategy", "atc", "--scheme", "none", "--account"]
    assert main([*argv, "--out", str(tmp_path)]) == 0
    (line,) = [x for x in capsys.readouterr().err.splitlines() if x.startswith("wrote")]
    names = {n.strip() for n in line.split(":", 1)[1].split(",")}
    assert names == {p.name for p in tmp_path.iterdir()}
    assert {"epsilon.png", "testing_error.png"} <= names


def test_config_errors_name_the_setting() -> None:
    from privnet.orchestrator.experiment.config import ExperimentConfig, with_overrides

    for key, value, says in [
        ("agents", "twelve", "give an integer"),
        ("mu", "fast", "give a number"),
        ("schemes", [1, 2], "a list of names"),
        ("rekey", "sometimes", "choose once, every-round"),
        ("rho", float("inf"), "rho must be >= 0"),
    ]:
        with pytest.raises(ConfigError, match=says):
            with_overrides(ExperimentConfig(), {key: value})
    assert with_overrides(ExperimentConfig(), {"mu": 1}).mu == 1.0  # an int where a float goes
