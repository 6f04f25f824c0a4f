"""`python -m privnet.agent --claim DIR`: each process claims its own launch; a claim is remembered
only where asked (`--remember FILE`, a container's own filesystem), and never outlives the
launches it was made from."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from privnet.agent.__main__ import claim
from privnet.orchestrator.engines.lifetime import RunSecrets
from privnet.orchestrator.engines.prepare import write_launches


def launches(directory: Path, agents: int = 3, run: str = "run-claims") -> RunSecrets:
    """What `privnet prepare` writes into agents/: one launch file per agent."""
    secrets = RunSecrets.generate(run, agents)
    write_launches(directory, secrets.launches("broker:1883", secrets.credentials.access))
    return secrets


def test_processes_on_one_host_claim_different_agents(tmp_path: Path) -> None:
    """The same host, the same temp directory, no --remember: agents 0, 1, 2, then none."""
    launches(tmp_path)
    claimed = [claim(tmp_path).agent for _ in range(3)]
    assert claimed == [0, 1, 2]
    assert not list(tmp_path.glob("agent-*.json"))  # read, then removed
    done = subprocess.run(
        [sys.executable, "-m", "privnet.agent", "--claim", str(tmp_path)],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 2 and "no unclaimed agent-<id>.json" in done.stderr


def test_a_remembered_claim_comes_back_and_a_stale_one_does_not(tmp_path: Path) -> None:
    agents, memory = tmp_path / "agents", tmp_path / "container-tmp" / "claim.json"
    memory.parent.mkdir()
    first = launches(agents)
    mine = claim(agents, memory)
    assert (mine.agent, mine.rejoin) == (0, False)
    assert memory.stat().st_mode & 0o777 == 0o600
    again = claim(agents, memory)  # the container started again: the same agent, rejoining
    assert (again.agent, again.token, again.rejoin) == (0, mine.token, True)
    assert again.checkpoints == str(memory.with_suffix(".checkpoints"))
    assert claim(agents).agent == 1  # another container
    second = launches(agents)  # a new `privnet prepare`: new launches, old claims gone
    assert second.tokens[0] != first.tokens[0]
    fresh = claim(agents, memory)
    assert (fresh.agent, fresh.rejoin, fresh.token) == (0, False, second.tokens[0].hex())
    assert json.loads(memory.read_text())["launch"]["token"] == second.tokens[0].hex()
