"""One agent process: its nodes served on their connections until the run ends, and their
checkpoints on disk. `python -m privnet.agent` (`privnet/agent/__main__.py`) reads the launch and
calls this."""

from __future__ import annotations

import asyncio
import logging
import time
from pathlib import Path

from privnet.agent import keys
from privnet.agent.access import BrokerAddress, ClientAccess
from privnet.agent.driver import publish, pump
from privnet.agent.launch import AgentLaunch
from privnet.agent.node import AgentNode, Launch
from privnet.agent.phases import Phase
from privnet.agent.private import private_dir, write_private
from privnet.agent.protocol import Checkpoint, Output
from privnet.agent.transport import RECONNECT_BUDGET, MqttError, client

log = logging.getLogger("privnet.agent")


def _log(out: Output, me: int) -> None:
    for event in out.events:
        level = logging.ERROR if event.kind == "failed" else logging.INFO
        log.log(level, "agent %s %s %s", me, event.kind, event.detail)


async def run_agents(launches: list[AgentLaunch]) -> int:
    """Several agents in one process and one event loop, each with its own connection,
    credentials, identity and node; the worst exit code."""
    codes = await asyncio.gather(
        *(run_agent(*launch.parts(), checkpoints=launch.checkpoints) for launch in launches)
    )
    return max(codes)


def checkpoint_path(directory: str | Path, agent: int) -> Path:
    return Path(directory) / f"agent-{agent}.ckpt"


def save_checkpoint(path: Path, checkpoint: Checkpoint) -> None:
    """Atomically (a crash mid-write leaves the previous one), readable by the owner only:
    it holds true models."""
    write_private(path, checkpoint.to_bytes())


def load_checkpoint(path: Path | None) -> Checkpoint | None:
    if path is None or not path.exists():
        return None
    return Checkpoint.from_bytes(path.read_bytes(), str(path))


async def run_agent(
    broker: BrokerAddress,
    launch: Launch,
    access: ClientAccess,
    checkpoints: str | Path | None = None,
) -> int:
    """Register, serve sessions until Bye (0), a failure (2) or a lost broker (3). A broker
    not there yet is waited for, as long as a lost one would be (RECONNECT_BUDGET s).

    With `checkpoints` (a directory) the agent saves its checkpoints there, and, when
    launched to rejoin, starts from the one it finds."""
    path = None if checkpoints is None else checkpoint_path(checkpoints, launch.agent)
    if path is not None:
        private_dir(path.parent)
    start = load_checkpoint(path) if launch.rejoin else None
    if start is not None and (start.run, start.agent) != (launch.run, launch.agent):
        log.warning("agent %s: %s is another run's checkpoint; not used", launch.agent, path)
        start = None
    node = AgentNode(launch, keys.Identity.generate(), checkpoint=start)

    def on_output(out: Output) -> None:
        _log(out, node.me)
        if out.checkpoint is not None and path is not None:
            save_checkpoint(path, out.checkpoint)

    try:
        async with client(broker, access, first_wait=RECONNECT_BUDGET) as mqtt:
            for topic, qos in node.subscription_qos.items():
                await mqtt.subscribe(topic, qos)
            publish(mqtt, node.start(time.monotonic()))
            await pump(mqtt, node, lambda: node.done, on_output)
    except (MqttError, TimeoutError) as exc:
        log.error("agent %s: %s", launch.agent, exc or f"no answer from the broker at {broker}")
        return 3
    return 0 if node.phase is Phase.CLOSED else 2
