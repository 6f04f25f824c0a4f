"""Per-run broker users, their passwords, and the ACL that confines each of them.

Every run gets fresh users from OS entropy: one per agent (its id as username),
`orchestrator` (the whole run, and $SYS) and `inspector` (reads the whole run and $SYS,
writes nothing); anonymous clients have none, so both brokers refuse them. One table of
rules (`acl_rules`) is rendered into each broker's own formats, so mosquitto and the
embedded broker enforce exactly the same thing. Passwords are 256 random bits, so their
files hash them cheaply: stretching only helps guessable passwords, and a costly hash
would queue 30 agents connecting at once.
"""

from __future__ import annotations

import base64
import hashlib
import json
import secrets
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from pwdlib.hashers.argon2 import Argon2Hasher

from privnet.agent.access import ClientAccess
from privnet.agent.private import write_private
from privnet.agent.topics import run_filter

__all__ = ["Credentials", "write_private"]  # write_private: privnet/broker/ writes through it

ORCHESTRATOR = "orchestrator"
INSPECTOR = "inspector"
SYS_FILTER = "$SYS/#"
PBKDF2_ROUNDS = 101  # what mosquitto_passwd 2.0 writes
_ARGON2 = Argon2Hasher(time_cost=1, memory_cost=1024, parallelism=1)


@dataclass(frozen=True)
class Rules:
    """Topic filters one user may publish on (write) and subscribe to (read)."""

    read: tuple[str, ...]
    write: tuple[str, ...]


def acl_rules(run: str, agents: int) -> dict[str, Rules]:
    """Who may do what in `run`: agent m writes only as m, reads only what is addressed to it.

    agent m: writes `to/+/from/m`, `ctl/up/m`, `telemetry/m`; reads `to/m/from/+`,
    `ctl/down/m`, `ctl/down/all`. orchestrator: reads and writes `privnet/<run>/#`, reads $SYS.
    inspector: reads `privnet/<run>/#` and $SYS, writes nothing.
    """
    _check_agents(agents)
    everything = run_filter(run)
    rules = {
        ORCHESTRATOR: Rules(read=(everything, SYS_FILTER), write=(everything,)),
        INSPECTOR: Rules(read=(everything, SYS_FILTER), write=()),
    }
    for m in range(agents):
        rules[str(m)] = agent_rules(run, m)
    return rules


def agent_rules(run: str, m: int) -> Rules:
    """Agent m's rules: what `acl_rules` gives it, and what a bridge carrying m may do."""
    base = run_filter(run).removesuffix("/#")
    return Rules(
        read=(f"{base}/to/{m}/from/+", f"{base}/ctl/down/{m}", f"{base}/ctl/down/all"),
        write=(f"{base}/to/+/from/{m}", f"{base}/ctl/up/{m}", f"{base}/telemetry/{m}"),
    )


@dataclass(frozen=True)
class Credentials:
    """The users of one run and their passwords; `generate` makes fresh ones."""

    run: str
    agents: int
    passwords: Mapping[str, str] = field(repr=False)

    def __post_init__(self) -> None:
        expected = set(acl_rules(self.run, self.agents))
        if set(self.passwords) != expected:
            missing, extra = expected - set(self.passwords), set(self.passwords) - expected
            raise ValueError(
                f"credentials of run {self.run!r} with {self.agents} agents need exactly the "
                f"users 0..{self.agents - 1}, {ORCHESTRATOR} and {INSPECTOR}: missing "
                f"{sorted(missing)}, unexpected {sorted(extra)}; regenerate them "
                "(python -m privnet.broker credentials)"
            )
        bad = [u for u, p in self.passwords.items() if not isinstance(p, str) or len(p) < 16]
        if bad:
            raise ValueError(f"passwords of {sorted(bad)} are not strings of >= 16 characters")

    @classmethod
    def generate(cls, run: str, agents: int) -> Credentials:
        """Fresh users for `run` with `agents` agents, 256-bit passwords from OS entropy."""
        return cls(
            run, agents, {user: secrets.token_urlsafe(32) for user in acl_rules(run, agents)}
        )

    def access(
        self, user: str, *, tls: bool = False, ca_file: str | Path | None = None
    ) -> ClientAccess:
        """How `user` connects (agent id as text, "orchestrator" or "inspector")."""
        if user not in self.passwords:
            raise ValueError(
                f"no broker user {user!r} in run {self.run!r}: use an agent id "
                f"0..{self.agents - 1}, {ORCHESTRATOR!r} or {INSPECTOR!r}"
            )
        ca = str(ca_file) if ca_file is not None else None
        return ClientAccess(user, self.passwords[user], tls or ca is not None, ca)

    def to_json(self) -> str:
        return json.dumps({"run": self.run, "agents": self.agents, "passwords": self.passwords})

    @classmethod
    def from_json(cls, text: str) -> Credentials:
        """Credentials written by `to_json`; a clear error for anything else."""
        try:
            data = json.loads(text)
            return cls(str(data["run"]), int(data["agents"]), dict(data["passwords"]))
        except (ValueError, KeyError, TypeError) as exc:
            raise ValueError(
                f"not privnet credentials ({exc}): expected the JSON that "
                "`python -m privnet.broker credentials` writes (run, agents, passwords)"
            ) from exc

    def mosquitto_password_file(self) -> str:
        """mosquitto 2.0 `password_file` of every user (`mosquitto_password_file`)."""
        return mosquitto_password_file(self.passwords)

    def amqtt_password_file(self) -> str:
        """amqtt FileAuthPlugin's `password_file`: `user:<argon2id hash>` (it reads Argon2)."""
        return "".join(f"{u}:{_ARGON2.hash(p)}\n" for u, p in self.passwords.items())

    def mosquitto_acl(self) -> str:
        """mosquitto `acl_file` of every user (`mosquitto_acl`)."""
        title = f"privnet ACL of run {self.run!r}, agents 0..{self.agents - 1}"
        return mosquitto_acl(title, acl_rules(self.run, self.agents))

    def amqtt_acl(self) -> dict[str, dict[str, list[str]]]:
        """amqtt TopicAccessControlListPlugin config: `acl` (subscribe) and `publish_acl`."""
        rules = acl_rules(self.run, self.agents)
        return {
            "acl": {user: list(r.read) for user, r in rules.items()},
            "publish_acl": {user: list(r.write) for user, r in rules.items()},
        }


@dataclass(frozen=True)
class Users:
    """Some users and their rules, for a broker that serves part of a run: a site's broker
    (its agents), or the core broker of a run across hosts (its bridges, no agent)."""

    title: str
    passwords: Mapping[str, str] = field(repr=False)
    rules: Mapping[str, Rules]

    def mosquitto_password_file(self) -> str:
        return mosquitto_password_file(self.passwords)

    def mosquitto_acl(self) -> str:
        return mosquitto_acl(self.title, self.rules)


def mosquitto_password_file(passwords: Mapping[str, str]) -> str:
    """mosquitto 2.0 `password_file`: `user:$7$rounds$salt$hash`, PBKDF2-HMAC-SHA512."""
    lines = []
    for user, password in passwords.items():
        salt = secrets.token_bytes(12)
        digest = hashlib.pbkdf2_hmac("sha512", password.encode(), salt, PBKDF2_ROUNDS)
        b64 = base64.b64encode
        lines.append(f"{user}:$7${PBKDF2_ROUNDS}${b64(salt).decode()}${b64(digest).decode()}")
    return "\n".join(lines) + "\n"


def mosquitto_acl(title: str, rules: Mapping[str, Rules]) -> str:
    """mosquitto `acl_file`: one `user` block each; no `pattern` lines, nothing anonymous."""
    out = [f"# {title}; generated"]
    for user, rule in rules.items():
        both = [t for t in rule.read if t in rule.write]
        out += ["", f"user {user}"]
        out += [f"topic readwrite {t}" for t in both]
        out += [f"topic read {t}" for t in rule.read if t not in both]
        out += [f"topic write {t}" for t in rule.write if t not in both]
    return "\n".join(out) + "\n"


def _check_agents(agents: int) -> None:
    if isinstance(agents, bool) or not isinstance(agents, int) or agents < 1:
        raise ValueError(f"bad agent count {agents!r}: a run needs at least 1 agent")
