"""The live view: its state, its server's guard, and the page in a real browser.

The browser tests drive Debian's chromium with Playwright (a pinned version that speaks its
protocol); they skip where either is missing, except in CI (PRIVNET_REQUIRE_BROWSER=1).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import psutil
import pytest
from conftest import busy, skip_unless_required
from test_net import agent_process, stopped

from privnet.agent.spec import Scheme, Strategy
from privnet.orchestrator import overhead
from privnet.orchestrator.cli import main
from privnet.orchestrator.experiment.config import ExperimentConfig
from privnet.orchestrator.experiment.instance import Instance
from privnet.orchestrator.experiment.specs import session_list, session_plans
from privnet.orchestrator.view.files import load_run
from privnet.orchestrator.view.links import link_bytes
from privnet.orchestrator.view.server import ViewServer
from privnet.orchestrator.view.state import Cursor, Series, ViewState

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
PRIVNET = [sys.executable, "-m", "privnet.orchestrator.cli"]

# ---- the state: bounded, and what a page lacks -------------------------------------------


def test_series_thins_past_its_cap_and_a_page_gets_it_whole_again() -> None:
    series = Series("x", "y", cap=8)
    seen: tuple[int, int] | None = None
    for x in range(8):
        series.add(x, x * x)
    part, seen = series.since(seen)
    assert part is not None and part["reset"] and part["x"] == list(range(8))
    series.add(8, float("nan"))  # the cap is reached: every other point is kept
    assert len(series) == 5 and series.data["x"] == [0, 2, 4, 6, 8]
    assert series.data["y"][-1] is None  # NaN is no JSON: a gap
    part, seen = series.since(seen)
    assert part is not None and part["reset"] and part["x"] == [0, 2, 4, 6, 8]
    series.add(9, 81)
    part, seen = series.since(seen)
    assert part == {"reset": False, "x": [9], "y": [81]}
    assert series.since(seen)[0] is None


def test_a_delta_carries_only_new_points_and_new_timeline_entries() -> None:
    state = ViewState({"run": "r"}, [(0.0, 0.0), (1.0, 1.0)])
    state.set_edges([(1, 0), (0, 0)])  # self-loops are no links; pairs are sorted
    assert state.edges == [(0, 1)]
    cursor = Cursor()
    state.curve("atc/none/0").add(1, -3.0, -2.0, -1.0)
    state.note(0.5, "atc/none/0", "view", "first")
    first = state.snapshot(cursor)
    assert first["meta"] == {"run": "r"} and first["timeline"] == [
        (0.5, "atc/none/0", "view", "first")
    ]
    assert first["series"]["curve:atc/none/0"]["round"] == [1]
    state.curve("atc/none/0").add(2, None, None, -1.5)  # a round without models (K > 1)
    later = state.delta(cursor)
    assert later["series"] == {
        "curve:atc/none/0": {
            "reset": False,
            "round": [2],
            "centroid": [None],
            "average": [None],
            "agents": [-1.5],
        }
    }
    assert later["timeline"] == []
    json.dumps(later, allow_nan=False)


# ---- the server: a token, read-only ----------------------------------------------------------


def get(url: str, method: str = "GET") -> tuple[int, str, dict[str, str]]:
    request = urllib.request.Request(url, method=method)
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, response.read().decode(), dict(response.headers)
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode(), dict(exc.headers)


# What a page's URL without its token gets: 403 whatever the path; with it, only GET works.
REFUSED = {
    "missing": 403,
    "missing, a file": 403,
    "wrong": 403,
    "wrong, the stream": 403,
    "a prefix of it": 403,
    "post": 405,
}


def refusals(url: str) -> dict[str, int]:
    """Status codes of the URLs a page's token does not open (`url`: the page's own)."""
    root = url.rsplit("/", 2)[0]
    token = url.rstrip("/").rsplit("/", 1)[1]
    wrong = token[:-1] + ("A" if token[-1] != "A" else "B")
    return {
        "missing": get(f"{root}/")[0],
        "missing, a file": get(f"{root}/static/view.js")[0],
        "wrong": get(f"{root}/{wrong}/")[0],
        "wrong, the stream": get(f"{root}/{wrong}/events")[0],
        "a prefix of it": get(f"{root}/{token[:-1]}/")[0],
        "post": get(url, "POST")[0],
    }


async def test_the_page_needs_its_token_and_changes_nothing(tmp_path: Path) -> None:
    import asyncio

    state = ViewState({"run": "r", "agents": 1}, [(0.5, 0.5)])
    (tmp_path / "agent-0.log").write_text("".join(f"line {n}\n" for n in range(200)))
    server = ViewServer(state, tmp_path)
    url = await server.start("127.0.0.1", 0)
    try:
        got = await asyncio.to_thread(refusals, url)
        assert got == REFUSED
        status, page, headers = await asyncio.to_thread(get, url)
        assert status == 200 and 'src="static/view.js"' in page
        assert "default-src 'none'" in headers["Content-Security-Policy"]
        status, log, _ = await asyncio.to_thread(get, url + "log/0")
        assert status == 200 and log.splitlines()[-1] == "line 199" and "line 100\n" not in log
        assert (await asyncio.to_thread(get, url + "log/1"))[0] == 404  # no agent 1
        assert (await asyncio.to_thread(get, url + "static/..%2Fserver.py"))[0] == 404
    finally:
        await server.stop()


@pytest.mark.parametrize("sealed", [True, False])
def test_link_bytes_are_what_the_agents_send(sealed: bool) -> None:
    """The page's model bytes per link add up to the model bytes per round the agents'
    own frames weigh (the overhead meter taps them on the memory engine)."""
    config = ExperimentConfig(
        agents=8, iters=20, seed=5, strategies=(Strategy.ATC,), schemes=(Scheme.LOCAL_GHP,)
    )
    problem = Instance.build(replace(config, seal_links=sealed))
    (plan,) = session_plans(problem, session_list(problem.config))
    per_link = link_bytes(overhead.RUN, plan.specs, range(8), 1, 0, sealed)
    assert set(per_link) == {tuple(sorted(e)) for e in problem.graph.edges if e[0] != e[1]}
    measured = overhead.measure(problem, Strategy.ATC, Scheme.LOCAL_GHP).rounds.octets["model"]
    assert sum(per_link.values()) == measured / 20


def test_a_view_flag_without_view_is_refused(tmp_path: Path) -> None:
    assert main(["run", "--view-port", "8123", "--out", str(tmp_path)]) == 2


def test_a_finished_simulation_loads_as_the_page_state(tmp_path: Path) -> None:
    args = ["--agents", "6", "--iters", "30", "--seed", "3", "--strategy", "atc"]
    args += ["--scheme", "none,local-ghp"]
    assert main(["simulate", "--engine", "memory", *args, "--out", str(tmp_path)]) == 0
    state = load_run(tmp_path)
    snap = state.snapshot(Cursor())
    assert snap["meta"]["sessions"] == ["atc/none/0", "atc/local-ghp/0"]
    assert len(snap["nodes"]) == 6 and all(b > 0 for b in snap["edge_bytes"])
    for label in snap["meta"]["sessions"]:
        curve = snap["series"][f"curve:{label}"]
        assert curve["round"] == list(range(1, 31)) and None not in curve["centroid"]
    assert {r["label"] for r in snap["results"]} == {"atc/none", "atc/local-ghp"}
    with socket.create_server(("127.0.0.1", 0)) as taken:  # a port in use: a clear error
        port = str(taken.getsockname()[1])
        assert main(["view", str(tmp_path), "--port", port]) == 2
    assert main(["view", str(tmp_path / "nowhere")]) == 2


# ---- the page, in a real browser ----------------------------------------------------------


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    """Debian's chromium, driven by Playwright, with a fresh profile."""
    if not Path(CHROMIUM).exists():
        skip_unless_required(
            "PRIVNET_REQUIRE_BROWSER", f"no {CHROMIUM} (apt-get install chromium: scripts/setup)"
        )
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        skip_unless_required(
            "PRIVNET_REQUIRE_BROWSER", "Playwright is not installed (pip install -e '.[test]')"
        )
    with tempfile.TemporaryDirectory() as profile, sync_playwright() as pw:
        context = pw.chromium.launch_persistent_context(
            profile,
            executable_path=CHROMIUM,
            headless=True,
            args=CHROMIUM_ARGS,
            viewport={"width": 1600, "height": 900},
        )
        yield context
        context.close()


class Page:
    """A page of the view, with every console error and uncaught exception it shows."""

    def __init__(self, context: Any, url: str) -> None:
        self.errors: list[str] = []
        self.page = context.new_page()
        self.page.on("console", lambda m: m.type == "error" and self.errors.append(m.text))
        self.page.on("pageerror", lambda e: self.errors.append(str(e)))
        self.page.goto(url)

    def points(self) -> int:
        return int(self.page.get_attribute("#msd", "data-points") or 0)

    def phase(self, agent: int) -> str | None:
        return self.page.get_attribute(f"circle.agent[data-agent='{agent}']", "data-phase")

    def wait(self, what: str, ok: Any, timeout: float) -> None:
        end = time.monotonic() + timeout
        while not ok():
            assert time.monotonic() < end, f"the page did not show {what} within {timeout} s"
            self.page.wait_for_timeout(200)


def page_url(log: Path, proc: subprocess.Popen[bytes], prefix: str) -> str:
    end = time.monotonic() + 60
    while True:
        for line in log.read_text().splitlines():
            if line.startswith(prefix) and "http://" in line:
                return line[line.index("http://") :].split()[0]
        assert proc.poll() is None, log.read_text()
        assert time.monotonic() < end, f"no URL printed: {log.read_text()}"
        time.sleep(0.1)


def watched_run(flags: list[str], out: Path, log: Path) -> subprocess.Popen[bytes]:
    """`privnet run ... --view` in the background, its console in `log`."""
    with log.open("w") as err:
        return subprocess.Popen(
            [*PRIVNET, "run", *flags, "--out", str(out), "--view"],
            stdout=err,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env={**os.environ, "COLUMNS": "400"},
        )


@pytest.mark.net
def test_a_watched_run_in_a_browser(browser: Any, tmp_path: Path) -> None:
    """10 agents: the page shows them and their links, the MSD curve grows, an agent killed
    from outside turns excluded within the deadline, nothing errs, a wrong token gets 403;
    then `privnet view` of the finished run shows the final curves."""
    out, iters, deadline = tmp_path / "run", 4000, 10
    out.mkdir()
    log = out / "privnet.err"
    flags = ["--agents", "10", "--iters", str(iters), "--seed", "1", "--deadline", str(deadline)]
    privnet = watched_run(flags, out, log)
    with stopped(privnet):
        url = page_url(log, privnet, "view:")
        page = Page(browser, url)
        page.wait("10 agents", lambda: page.page.locator("circle.agent").count() == 10, 20)
        edges = json.loads((get(url + "state"))[1])["edges"]
        assert page.page.locator("line.edge").count() == len(edges) > 9  # connected: >= P - 1
        page.wait("running agents", lambda: page.phase(3) == "running", 30)
        page.wait("MSD points", lambda: page.points() > 0, 10)  # the page may be first
        before = page.points()
        page.wait("MSD points gained", lambda: page.points() > before, 10)
        assert refusals(url) == REFUSED
        victim = agent_process(psutil.Process(privnet.pid).children(recursive=True), 3)
        victim.send_signal(signal.SIGKILL)
        killed = time.monotonic()
        page.wait("agent 3 excluded", lambda: page.phase(3) == "excluded", deadline)
        seen_after = time.monotonic() - killed
        assert page.phase(4) in ("running", "keying", "held", "finished")
        assert page.errors == []
        assert privnet.wait(timeout=180) == 0, log.read_text()
    assert seen_after < deadline
    assert "lost" in (out / "view.json").read_text()

    with (tmp_path / "view.err").open("w") as err:
        viewer = subprocess.Popen(
            [*PRIVNET, "view", str(out)],
            stdout=err,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    with stopped(viewer):
        url = page_url(tmp_path / "view.err", viewer, "view of")
        page = Page(browser, url)
        page.wait("the final curve", lambda: page.points() == iters, 20)
        assert (
            page.phase(3) == "excluded"
            and page.page.get_attribute("body", "data-stage") == "finished"
        )
        assert page.page.locator("#timeline li.view").count() >= 1
        assert page.errors == []
        viewer.send_signal(signal.SIGINT)
        assert viewer.wait(timeout=20) in (0, 130)


def shown_round(page: Page) -> int:
    """The round the page's header shows ("round N / M"), 0 before any."""
    text = page.page.text_content("#progress") or ""
    return int(text.split()[1]) if text.startswith("round ") else 0


@pytest.mark.net
def test_the_page_of_a_busy_run_shows_every_agent_at_once_and_keeps_updating(
    browser: Any, tmp_path: Path
) -> None:
    """30 agents at full speed with 3 busy loops beside the run (issue 30): a page opened
    mid-run shows all 30 agents, each in its phase, within 3 s and its round keeps moving;
    a page closed mid-stream leaves no traceback on the console. The page is served from
    its own thread, so the orchestrator's busy loop does not starve it."""
    out = tmp_path / "run"
    out.mkdir()
    log = out / "privnet.err"
    flags = ["--agents", "30", "--iters", "100000", "--seed", "1", "--deadline", "30"]
    with busy(3):
        privnet = watched_run(flags, out, log)
        with stopped(privnet):
            url = page_url(log, privnet, "view:")
            end = time.monotonic() + 120
            while json.loads(get(url + "state")[1])["live"].get("stage") != "running":
                assert time.monotonic() < end and privnet.poll() is None, log.read_text()
                time.sleep(0.5)
            opened = time.monotonic()
            page = Page(browser, url)
            shown = "circle.agent:not([data-phase='registering'])"
            page.wait("30 agents", lambda: page.page.locator(shown).count() == 30, 3.0)
            took = time.monotonic() - opened
            print(f"the page showed 30 agents {took:.2f} s after it was opened")
            for _ in range(3):  # it keeps updating
                before = shown_round(page)
                page.wait("the round moving", lambda b=before: shown_round(page) > b, 5.0)
            assert page.errors == []
            page.page.close()  # the browser closes its stream mid-run
            time.sleep(2.0)
            privnet.send_signal(signal.SIGINT)
            assert privnet.wait(timeout=60) == 130, log.read_text()
    said = log.read_text()
    assert took < 3.0
    assert "Traceback" not in said and "ConnectionResetError" not in said, said[-3000:]
