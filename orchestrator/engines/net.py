"""The `net` engine: real agent processes talking through a real MQTT broker.

The orchestrator registers the agents (or spawns them locally), hands each its Setup,
starts the rounds, and collects sealed per-round telemetry. Whatever it started it stops:
on success, on failure and on Ctrl-C.
"""

from __future__ import annotations

import contextlib
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import aiomqtt
import numpy as np
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

from agent import control, keys, topics, wire
from agent.inbox import Inbox
from agent.messages import Rejected
from agent.mqtt import QOS, telemetry_context
from agent.spec import Scheme, Strategy
from orchestrator.engines.launch import Launcher, RunFailed
from orchestrator.experiment.problem import Problem
from orchestrator.experiment.specs import agent_specs

DEFAULT_DEADLINE = 30.0
POLL = 0.5  # how often child processes are checked while waiting


@dataclass
class Registration:
    agent: int
    nonce: bytes
    identity: bytes


@dataclass
class SessionResult:
    models: np.ndarray  # (iters, P, M): every agent's true model after every round
    finished: dict[int, control.Finished]
    wall: float  # Go to last Finished

    def totals(self, field_name: str) -> dict[str, int]:
        total: dict[str, int] = {}
        for done in self.finished.values():
            for key, value in getattr(done, field_name).items():
                total[key] = total.get(key, 0) + value
        return total


@dataclass
class Orchestrator:
    """Drives sessions over one MQTT connection."""

    client: aiomqtt.Client
    run: str
    agents: int
    pool: Launcher | None = None
    deadline: float = DEFAULT_DEADLINE
    telemetry: bool = True
    key: X25519PrivateKey = field(default_factory=X25519PrivateKey.generate)
    registrations: dict[int, Registration] = field(default_factory=dict)
    on_message: Callable[[str, bytes], None] | None = None
    _inbox: Inbox | None = None  # the audit taps here
    _checked: float = 0.0  # when the agent processes were last checked (time.monotonic)

    async def subscribe(self) -> None:
        base = f"{topics.PREFIX}/{self.run}"
        for pattern in (f"{base}/ctl/up/#", f"{base}/telemetry/+"):
            await self.client.subscribe(pattern, qos=QOS)

    async def _next(
        self, what: str, finished: set[int] = frozenset()
    ) -> tuple[str, control.Control]:
        """The next control/telemetry message, checking children and the deadline meanwhile.

        Both go by the clock, not by empty polls: a stream of junk (anyone may write to a
        registration topic) must not hide a dead agent or a stalled run.
        """
        if self._inbox is None:
            self._inbox = await Inbox(self.client).__aenter__()
        start = time.monotonic()
        while True:
            now = time.monotonic()
            if self.pool is not None and now - self._checked >= POLL:
                self.pool.check(finished)
                self._checked = now
            if now - start >= self.deadline:
                raise RunFailed(f"nothing heard for {self.deadline:.0f} s while {what}")
            try:
                message = await self._inbox.get(POLL)
            except TimeoutError:
                continue
            topic, payload = message.topic.value, bytes(message.payload)  # type: ignore[arg-type]
            try:
                msg = wire.decode_control(payload)
            except Rejected:
                continue  # not ours to act on; agents count and log their own
            if isinstance(msg, control.Failed):
                agent = self._agent_of(topic, msg.agent)
                tail = self.pool.log_tail(agent) if self.pool else ""
                raise RunFailed(f"agent {agent} failed: {msg.reason}{tail}")
            return topic, msg

    def _agent_of(self, topic: str, claimed: int) -> int:
        nonce = topic.rsplit("/", 1)[-1]
        for reg in self.registrations.values():
            if reg.nonce.hex() == nonce:
                return reg.agent
        return claimed

    async def register(self) -> None:
        """Wait for every agent's Hello and give each an id (its requested one if free)."""
        waiting: list[control.Hello] = []
        while len(waiting) < self.agents:
            _, msg = await self._next(
                f"waiting for agents to register ({len(waiting)}/{self.agents} so far)"
            )
            if isinstance(msg, control.Hello) and all(h.nonce != msg.nonce for h in waiting):
                waiting.append(msg)
        free = sorted(set(range(self.agents)) - {h.requested_id for h in waiting})
        for hello in waiting:
            wanted = hello.requested_id
            taken = wanted is not None and wanted in self.registrations
            if wanted is None or taken or not 0 <= wanted < self.agents:
                wanted = free.pop(0)
            self.registrations[wanted] = Registration(wanted, hello.nonce, hello.identity)
        public = keys.public_bytes(self.key.public_key())
        for reg in self.registrations.values():
            welcome = control.Welcome(reg.nonce, reg.agent, self.run, public)
            await self._send(topics.register_down(self.run, reg.nonce.hex()), welcome)

    async def _send(self, topic: str, msg: control.Control) -> None:
        await self.client.publish(topic, wire.encode_control(msg), qos=QOS)

    async def session(
        self,
        problem: Problem,
        strategy: Strategy,
        scheme: Scheme,
        repeat: int = 0,
        progress: Callable[[int, np.ndarray], None] | None = None,
    ) -> SessionResult:
        """One run of all rounds for one strategy x scheme x repeat."""
        specs = agent_specs(problem, strategy, scheme, repeat=repeat)
        problem_spec = problem.spec(repeat)
        directory = {p: reg.identity for p, reg in self.registrations.items()}
        for spec in specs:
            reg = self.registrations[spec.agent]
            setup = control.Setup(spec, problem_spec, directory, self.deadline, self.telemetry)
            await self._send(topics.register_down(self.run, reg.nonce.hex()), setup)
        ready: set[int] = set()
        while len(ready) < self.agents:
            _, msg = await self._next(f"waiting for Ready ({len(ready)}/{self.agents})")
            if isinstance(msg, control.Ready):
                ready.add(msg.agent)
        start = time.perf_counter()
        await self._send(topics.ctl_down(self.run, "all"), control.Go())
        return await self._collect(problem, specs[0].session, start, progress)

    async def _collect(self, problem, session, start, progress) -> SessionResult:
        c = problem.config
        models = np.full((c.iters, c.agents, c.dim), np.nan)
        counts = np.zeros(c.agents, dtype=np.int64)
        finished: dict[int, control.Finished] = {}
        while len(finished) < self.agents:
            lagging = np.flatnonzero(counts == counts.min()).tolist()
            _, msg = await self._next(
                f"running round {counts.min() + 1}; slowest agents: {lagging[:10]}", set(finished)
            )
            if isinstance(msg, control.Telemetry):
                blob = keys.open_sealed(
                    self.key, msg.sealed, telemetry_context(self.run, msg.agent, msg.round)
                )
                for report in wire.decode_reports(blob, c.dim):
                    if report.sender != msg.agent or not 1 <= report.round <= c.iters:
                        raise RunFailed(
                            f"agent {msg.agent} sent a report for agent {report.sender}, "
                            f"round {report.round}"
                        )
                    models[report.round - 1, report.sender] = report.w
                    counts[report.sender] += 1
                if progress is not None:
                    progress(int(counts.min()), models)
            elif isinstance(msg, control.Finished):
                finished[msg.agent] = msg
        wall = time.perf_counter() - start
        if self.telemetry and np.isnan(models).any():
            missing = np.argwhere(np.isnan(models[..., 0]))[:5].tolist()
            raise RunFailed(f"telemetry incomplete: missing (round-1, agent) {missing}")
        return SessionResult(models, finished, wall)

    async def close(self) -> None:
        if self._inbox is not None:
            await self._inbox.__aexit__(None, None, None)

    async def bye(self) -> None:
        await self._send(topics.ctl_down(self.run, "all"), control.Bye())

    async def abort(self, reason: str) -> None:
        with contextlib.suppress(aiomqtt.MqttError):
            await self._send(topics.ctl_down(self.run, "all"), control.Abort(reason))


def new_run_name() -> str:
    return f"run-{secrets.token_hex(4)}"
