"""What an agent process is started with (`AgentLaunch`), handed over out of band: as
environment variables, a file, or a list of launches for several agents in one process."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path

from privnet.agent import keys
from privnet.agent.access import BrokerAddress, ClientAccess
from privnet.agent.node import Launch


@dataclass(frozen=True)
class AgentLaunch:
    """Everything an agent process is started with, as environment variables or a file.

    The token and password are secrets: they travel in the process environment or a
    0600 file, never on a command line (which every local user can read).
    """

    broker: str
    run: str
    agent: int
    orchestrator: str  # hex of the orchestrator's PublicIdentity (64 bytes)
    token: str  # hex, 32 bytes
    username: str | None = None
    password: str | None = None
    tls: bool = False
    ca_file: str | None = None  # the run's CA certificate (PEM): the broker is verified
    rejoin: bool = False  # started again mid-run: come back from the checkpoint, if any
    checkpoints: str | None = None  # directory for this agent's checkpoint file

    ENV = "PRIVNET_LAUNCH"  # the whole launch as JSON, in one variable
    GROUP_ENV = "PRIVNET_LAUNCHES"  # several agents in one process: a JSON list of launches

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    def to_env(self) -> dict[str, str]:
        return {self.ENV: self.to_json()}

    @classmethod
    def group_json(cls, launches: list[AgentLaunch]) -> str:
        """Several launches as one JSON list: $PRIVNET_LAUNCHES, or a stack's launches.json."""
        return json.dumps([asdict(a) for a in launches])

    @classmethod
    def group_env(cls, launches: list[AgentLaunch]) -> dict[str, str]:
        return {cls.GROUP_ENV: cls.group_json(launches)}

    @classmethod
    def group_from_env(cls, env: Mapping[str, str] = os.environ) -> list[AgentLaunch] | None:
        text = env.get(cls.GROUP_ENV)
        return None if text is None else cls.group_from_json(text, f"${cls.GROUP_ENV}")

    @classmethod
    def group_from_json(cls, text: str, where: str) -> list[AgentLaunch]:
        try:
            items = json.loads(text)
            if not isinstance(items, list) or not items:
                raise ValueError("not a non-empty list")
        except ValueError as exc:
            raise ValueError(f"{where} is not a list of launches: {exc}") from None
        return [cls.from_json(json.dumps(item), f"{where}[{n}]") for n, item in enumerate(items)]

    @classmethod
    def from_json(cls, text: str, where: str) -> AgentLaunch:
        try:
            data = json.loads(text)
            launch = cls(**data)
            launch.parts()
        except (ValueError, TypeError, keys.BadKey) as exc:
            raise ValueError(f"{where} is not a privnet agent launch: {exc}") from None
        return launch

    @classmethod
    def from_env(cls, env: Mapping[str, str] = os.environ) -> AgentLaunch | None:
        text = env.get(cls.ENV)
        return None if text is None else cls.from_json(text, f"${cls.ENV}")

    @classmethod
    def from_file(cls, path: Path) -> AgentLaunch:
        return cls.from_json(path.read_text(), str(path))

    def parts(self) -> tuple[BrokerAddress, Launch, ClientAccess]:
        identity = keys.PublicIdentity.from_bytes(bytes.fromhex(self.orchestrator))
        token = bytes.fromhex(self.token)
        if len(token) != 32:
            raise ValueError(f"token must be 32 bytes, got {len(token)}")
        launch = Launch(self.run, int(self.agent), identity, token, bool(self.rejoin))
        access = ClientAccess(self.username, self.password, self.tls, self.ca_file)
        return BrokerAddress.parse(self.broker), launch, access
