"""What one MQTT client needs to connect to a run's broker (where: `BrokerAddress`; as whom:
`ClientAccess`), and how it is handed over.

The orchestrator gives each agent process its own `ClientAccess` through the environment
(`to_env`: PRIVNET_MQTT_USERNAME, PRIVNET_MQTT_PASSWORD, PRIVNET_MQTT_CAFILE, PRIVNET_MQTT_TLS)
and the agent rebuilds it (`from_env`). This module needs only the standard library (and
aiomqtt for `client_kwargs`, imported there: agents speak gmqtt), so agent processes and the
broker share it without loading the agent's runtime.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from privnet.agent.spec import ConfigError

ENV_USERNAME = "PRIVNET_MQTT_USERNAME"
ENV_PASSWORD = "PRIVNET_MQTT_PASSWORD"
ENV_CAFILE = "PRIVNET_MQTT_CAFILE"
ENV_TLS = "PRIVNET_MQTT_TLS"


@dataclass(frozen=True)
class BrokerAddress:
    """Where clients connect."""

    host: str
    port: int

    @classmethod
    def parse(cls, text: str) -> BrokerAddress:
        """'HOST:PORT' or '[IPv6]:PORT'."""
        host, sep, port = text.strip().rpartition(":")
        host = host.removeprefix("[").removesuffix("]")
        if not sep or not host or not port.isdigit() or not 0 < int(port) < 65_536:
            raise ConfigError(
                f"bad broker address {text!r}: write HOST:PORT with a port in 1-65535, "
                "e.g. 127.0.0.1:1883 or [::1]:1883"
            )
        return cls(host, int(port))

    def __str__(self) -> str:
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"


@dataclass(frozen=True)
class ClientAccess:
    """What one MQTT client needs to connect: its user, and how to verify the broker.

    An agent process rebuilds it from its environment (`from_env`).
    """

    username: str | None = None
    password: str | None = field(default=None, repr=False)
    tls: bool = False
    ca_file: str | None = None
    """PEM file of the CA that signed the broker's certificate; None with tls: system CAs."""

    def client_kwargs(self) -> dict[str, Any]:
        """Keyword arguments for `aiomqtt.Client` (besides hostname and port). No client
        identifier: a broker with the run's users makes it the username, others pick a random
        one."""
        import aiomqtt

        kwargs: dict[str, Any] = {"username": self.username, "password": self.password}
        if self.tls:
            kwargs["tls_params"] = aiomqtt.TLSParameters(ca_certs=self.ca_file)
        return kwargs

    def to_env(self) -> dict[str, str]:
        """Environment variables that hand this access to a child process (see `from_env`)."""
        env = {ENV_TLS: "1" if self.tls else "0"}
        for key, value in (
            (ENV_USERNAME, self.username),
            (ENV_PASSWORD, self.password),
            (ENV_CAFILE, self.ca_file),
        ):
            if value is not None:
                env[key] = value
        return env

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> ClientAccess:
        """The access `to_env` wrote (default: os.environ); anonymous when none is set."""
        env = os.environ if env is None else env
        tls = env.get(ENV_TLS, "0")
        if tls not in ("0", "1"):
            raise ValueError(f"bad {ENV_TLS}={tls!r}: use 1 (TLS) or 0 (plain TCP)")
        return cls(
            username=env.get(ENV_USERNAME),
            password=env.get(ENV_PASSWORD),
            tls=tls == "1" or ENV_CAFILE in env,
            ca_file=env.get(ENV_CAFILE),
        )
