"""What a networked run holds from its start to its end, wherever its agents run (`privnet
run` here, `privnet site` on each host): the secrets it starts with, and the signals that
stop it.
"""

from __future__ import annotations

import asyncio
import json
import secrets
import signal
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from privnet.agent import keys
from privnet.agent.access import ClientAccess
from privnet.agent.launch import AgentLaunch
from privnet.agent.spec import ConfigError
from privnet.broker.credentials import Credentials
from privnet.orchestrator.terminal import console


@dataclass
class RunSecrets:
    """What a run starts with and never sends through the broker: the orchestrator's key,
    each agent's launch token, everyone's broker credentials.

    `privnet run` makes them itself; for agents someone else starts (compose),
    `privnet prepare` writes them to files first.
    """

    run: str
    orchestrator: keys.Identity
    tokens: dict[int, bytes]
    credentials: Credentials

    @classmethod
    def generate(cls, run: str, agents: int) -> RunSecrets:
        return cls(
            run,
            keys.Identity.generate(),
            {p: secrets.token_bytes(32) for p in range(agents)},
            Credentials.generate(run, agents),
        )

    def to_json(self) -> str:
        return json.dumps(
            {
                "run": self.run,
                "orchestrator": self.orchestrator.private_bytes().hex(),
                "tokens": {str(p): t.hex() for p, t in self.tokens.items()},
                "credentials": json.loads(self.credentials.to_json()),
            }
        )

    @classmethod
    def from_json(cls, text: str, where: str) -> RunSecrets:
        try:
            data = json.loads(text)
            return cls(
                data["run"],
                keys.Identity.from_private_bytes(bytes.fromhex(data["orchestrator"])),
                {int(p): bytes.fromhex(t) for p, t in data["tokens"].items()},
                Credentials.from_json(json.dumps(data["credentials"])),
            )
        except (ValueError, KeyError, TypeError, keys.BadKey) as exc:
            raise ConfigError(
                f"{where} is not a privnet run file ({exc!r}): write one with `privnet prepare`"
            ) from None

    def launches(
        self, broker: str, access: Callable[[str], ClientAccess]
    ) -> dict[int, AgentLaunch]:
        """What each agent is started with: never sent through the broker."""
        public = self.orchestrator.public.to_bytes().hex()
        out = {}
        for p, token in self.tokens.items():
            a = access(str(p))
            out[p] = AgentLaunch(
                broker,
                self.run,
                p,
                public,
                token.hex(),
                a.username,
                a.password,
                a.tls,
                a.ca_file,
            )
        return out


class Stop:
    """SIGINT and SIGTERM while a run goes on, taken on its event loop (between callbacks,
    never raised inside one: a protocol's read callback, say): the first cancels the run's
    task, whose teardown tells the agents (Abort) and stops what the run started. Once the
    run is complete (`finishing`) a signal lets its outputs be written first (under compose
    the first agent to leave stops every container, the orchestrator's included). Also when
    the shell started us with SIGINT ignored (`privnet run &` in a script)."""

    SIGNALS = (signal.SIGINT, signal.SIGTERM)

    def __init__(self, task: asyncio.Task[Any]) -> None:
        self.task = task
        self.signum: int | None = None  # the first signal received
        self.finishing = False
        # Only the main thread takes signals (`privnet.run` inside a running event loop runs
        # the network on a thread of its own: the caller's handlers stay as they are).
        main = threading.current_thread() is threading.main_thread()
        self._previous = {s: signal.getsignal(s) for s in self.SIGNALS} if main else {}
        loop = asyncio.get_running_loop()
        for s in self._previous:
            loop.add_signal_handler(s, self._received, s)

    def _received(self, signum: int) -> None:
        if self.signum is not None:
            return
        self.signum = signum
        name = signal.Signals(signum).name
        if self.finishing:
            console.print(f"[yellow]{name}: the run is complete; its outputs go first[/yellow]")
        else:
            self.task.cancel(name)

    @property
    def stopping(self) -> bool:
        """A signal stops the run (it came before the run was complete)."""
        return self.signum is not None and not self.finishing

    def close(self) -> None:
        loop = asyncio.get_running_loop()
        for s, previous in self._previous.items():
            loop.remove_signal_handler(s)
            if previous is not None:  # else not installed from Python: the loop's default
                signal.signal(s, previous)
