"""`privnet run --faults`: faults injected at chosen rounds, for tests and demos.

`kill:7@120` sends SIGKILL to agent 7's process once every member has completed round 120;
`stop:12@200+15s` stops agent 12 (SIGSTOP) for 15 s, then lets it go on (SIGCONT);
`flap:3@40` starts an insider holding agent 3's broker credentials that connects again and
again, taking agent 3's connection over each time (`flap:3@40+30s`: for 30 s; else to the
end of the run; see `privnet.orchestrator.insider`); `broker@300` kills the broker and
starts it again (`broker@300+2s`: after 2 s). The run handles them exactly as faults
from outside: it sees a process end, a heartbeat missing, a connection drop, a stall,
never the fault list.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from privnet.agent.spec import ConfigError

_FAULT = re.compile(r"^(?:(kill|stop|flap):(\d+)|(broker))@(\d+)(?:\+(\d+(?:\.\d+)?)s)?$")
BROKER_DOWN = 1.0  # seconds the broker stays down by default


@dataclass(frozen=True)
class Fault:
    kind: str  # kill, stop, flap or broker
    round: int  # once every member has completed this round (of the session running)
    agent: int | None = None
    seconds: float = 0.0  # stop: how long; broker: how long down; flap: how long (0: on)

    def __str__(self) -> str:
        who = "broker" if self.agent is None else f"{self.kind}:{self.agent}"
        return f"{who}@{self.round}" + (f"+{self.seconds:g}s" if self.seconds else "")


def parse_faults(text: str, agents: int) -> list[Fault]:
    """'kill:7@120,stop:12@200+15s,broker@300' -> Faults in round order; ConfigError says
    which item is wrong and how to write it."""
    faults = []
    for item in filter(None, (part.strip() for part in text.split(","))):
        match = _FAULT.match(item)
        if match is None:
            raise ConfigError(
                f"--faults item {item!r}: write kill:AGENT@ROUND, stop:AGENT@ROUND+SECONDSs, "
                "flap:AGENT@ROUND[+SECONDSs] or broker@ROUND[+SECONDSs], e.g. "
                "kill:7@120,stop:12@200+15s,flap:3@40,broker@300"
            )
        kind, agent, broker, at, seconds = match.groups()
        if broker:
            faults.append(Fault("broker", int(at), None, float(seconds or BROKER_DOWN)))
            continue
        if not 0 <= int(agent) < agents:
            raise ConfigError(f"--faults item {item!r}: agent {agent} is not in [0, {agents})")
        if kind == "stop" and not seconds:
            raise ConfigError(f"--faults item {item!r}: say how long, e.g. stop:{agent}@{at}+15s")
        faults.append(Fault(kind, int(at), int(agent), float(seconds or 0.0)))
    return sorted(faults, key=lambda f: f.round)
