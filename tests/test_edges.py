"""privnet's edges (issue 21): one file knows gmqtt and one knows amqtt; no source reads a
private member of another library's object outside those adapter files; every private
member an adapter touches is pinned to the library version it was written against; and the
broker loads none of the agent's runtime."""

from __future__ import annotations

import ast
import hashlib
import importlib
import importlib.metadata
import inspect
import re
import subprocess
import sys
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SOURCES = ("privnet",)
ADAPTERS = {  # library -> the one file that may import it and touch its internals
    "gmqtt": "privnet/agent/gmqtt_adapter.py",
    "amqtt": "privnet/broker/embedded.py",
    "docker": "privnet/orchestrator/engines/docker_sdk.py",  # imported where used (optional)
}
DOCUMENTED = {"os._exit"}  # an underscore, but the library's public API
HANDLER = "amqtt.mqtt.protocol.broker_handler:BrokerProtocolHandler"

# What each adapter relies on: the library version, and each member it touches -> the
# library function that defines or sets it, whose source is pinned in DIGESTS. Public
# members listed are ones the adapter replaces or bypasses.
PINNED: dict[str, tuple[str, dict[str, str]]] = {
    "gmqtt": (
        "0.8.0",
        {
            "_code": "gmqtt.mqtt.handler:MQTTConnectError.__init__",
            "_connack_received": "gmqtt.client:Client.__init__",
            "_connection_lost": "gmqtt.client:Client.__init__",
            "_connection_state": "gmqtt.client:Client.__init__",
            "_logger": "gmqtt.client:Client.__init__",
            "_package_handler": "gmqtt.client:Client.__init__",
            "_create_connection": "gmqtt.client:Client._create_connection",
            "_disconnect": "gmqtt.client:Client._disconnect",
            "_exit_reconnecting_state": "gmqtt.client:Client._exit_reconnecting_state",
            "_connection": "gmqtt.mqtt.protocol:BaseMQTTProtocol.set_connection",
            "_transport": "gmqtt.mqtt.protocol:BaseMQTTProtocol.connection_made",
            "connection_made": "gmqtt.mqtt.protocol:MQTTProtocol.connection_made",
            "_read_packet": "gmqtt.mqtt.protocol:MQTTProtocol._read_packet",
            "_handler": "gmqtt.mqtt.connection:MQTTConnection.__init__",
            "_last_data_in": "gmqtt.mqtt.connection:MQTTConnection.__init__",
        },
    ),
    "amqtt": (
        "0.12.1",
        {
            "_authenticate": "amqtt.broker:Broker._authenticate",
            "_broadcast_message": "amqtt.broker:Broker._broadcast_message",
            "_cleanup_session": "amqtt.broker:Broker._cleanup_session",
            "_del_all_subscriptions": "amqtt.broker:Broker._del_all_subscriptions",
            "_del_subscription": "amqtt.broker:Broker._del_subscription",
            "_handle_client_session": "amqtt.broker:Broker._handle_client_session",
            "_matches": "amqtt.broker:Broker._matches",
            "_retain_broadcast_message": "amqtt.broker:Broker._retain_broadcast_message",
            "_run_broadcast": "amqtt.broker:Broker._run_broadcast",
            "_topic_filtering": "amqtt.broker:Broker._topic_filtering",
            "_broadcast_queue": "amqtt.broker:Broker.__init__",
            "_session_monitor_task": "amqtt.broker:Broker.__init__",
            "_sessions": "amqtt.broker:Broker.__init__",
            "_subscriptions": "amqtt.broker:Broker.__init__",
            "_reader": "amqtt.adapters:StreamReaderAdapter.__init__",
            "_writer": "amqtt.adapters:StreamWriterAdapter.__init__",
            "handle_publish": "amqtt.mqtt.protocol.handler:ProtocolHandler.handle_publish",
            "mqtt_connack_authorize": f"{HANDLER}.mqtt_connack_authorize",
        },
    ),
}
DIGESTS = {  # sha256 of the source, first 16 hex digits (`digest`)
    "amqtt.adapters:StreamReaderAdapter.__init__": "2594a16cfbf64a25",
    "amqtt.adapters:StreamWriterAdapter.__init__": "9612036ac78e5ab2",
    "amqtt.broker:Broker.__init__": "5158ff3ca6493baf",
    "amqtt.broker:Broker._authenticate": "4d7db8cc6fe2c3f6",
    "amqtt.broker:Broker._broadcast_message": "78ad4edb7efb3b72",
    "amqtt.broker:Broker._cleanup_session": "530ae891d9f536cc",
    "amqtt.broker:Broker._del_all_subscriptions": "615579810f47d1e0",
    "amqtt.broker:Broker._del_subscription": "415f349273b0552d",
    "amqtt.broker:Broker._handle_client_session": "8b1b52a03df9daf5",
    "amqtt.broker:Broker._matches": "c03b25d98f4c0a34",
    "amqtt.broker:Broker._retain_broadcast_message": "884c193d6731d048",
    "amqtt.broker:Broker._run_broadcast": "e852128b3e38e04a",
    "amqtt.broker:Broker._topic_filtering": "9259ae5e1dd3e20d",
    f"{HANDLER}.mqtt_connack_authorize": "4e64256ea1f5c73c",
    "amqtt.mqtt.protocol.handler:ProtocolHandler.handle_publish": "b8f1fd3212c7134e",
    "gmqtt.client:Client.__init__": "4d62093fbb62807d",
    "gmqtt.client:Client._create_connection": "eecbcfadb743fef6",
    "gmqtt.client:Client._disconnect": "0880e631068852c4",
    "gmqtt.client:Client._exit_reconnecting_state": "b364c00a60a869a2",
    "gmqtt.mqtt.connection:MQTTConnection.__init__": "ba0aadceed08db23",
    "gmqtt.mqtt.handler:MQTTConnectError.__init__": "fd8a0ea4a4d94d02",
    "gmqtt.mqtt.protocol:BaseMQTTProtocol.connection_made": "ab3e1d76f0fb769f",
    "gmqtt.mqtt.protocol:BaseMQTTProtocol.set_connection": "1bdd2b4e86fbc4dd",
    "gmqtt.mqtt.protocol:MQTTProtocol._read_packet": "5691514d4aece9d9",
    "gmqtt.mqtt.protocol:MQTTProtocol.connection_made": "47edea4a50f057c3",
}


def sources() -> list[Path]:
    return sorted(p for d in SOURCES for p in (ROOT / d).rglob("*.py"))


def relative(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()


def private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


@cache
def library_source(library: str) -> str:
    top = Path(importlib.import_module(library).__file__ or "").parent
    return "\n".join(p.read_text() for p in top.rglob("*.py"))


@cache
def tree(path: Path) -> ast.Module:
    return ast.parse(path.read_text())


def digest(owner: str) -> str:
    module, _, qualname = owner.partition(":")
    obj: object = importlib.import_module(module)
    for part in qualname.split("."):
        obj = getattr(obj, part)
    return hashlib.sha256(inspect.getsource(obj).encode()).hexdigest()[:16]


@pytest.mark.parametrize("library", ["gmqtt", "amqtt"])
def test_a_library_is_imported_by_its_adapter_alone(library: str) -> None:
    importing = re.compile(rf"^\s*(?:import|from)\s+{library}\b", re.M)
    found = {relative(p) for p in sources() if importing.search(p.read_text())}
    assert found == {ADAPTERS[library]}


def reads_of_others_privates(path: Path, own: set[str]) -> list[str]:
    """`x._y` with `x` not self, cls or super(); `getattr(x, "_y")`; and `super()._y` or
    `self._y` where `_y` is none of the project's own members (`own`)."""
    found = []
    for node in ast.walk(tree(path)):
        if isinstance(node, ast.Attribute) and private(node.attr):
            receiver = node.value
            is_self = isinstance(receiver, ast.Name) and receiver.id in ("self", "cls")
            is_super = isinstance(receiver, ast.Call) and ast.unparse(receiver.func) == "super"
            if (is_self or is_super) and node.attr in own:
                continue
            if ast.unparse(node) not in DOCUMENTED:
                found.append(f"{relative(path)}:{node.lineno}: {ast.unparse(node)}")
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in ("getattr", "hasattr", "setattr")
            and len(node.args) > 1
            and isinstance(node.args[1], ast.Constant)
            and private(str(node.args[1].value))
        ):
            found.append(f"{relative(path)}:{node.lineno}: {ast.unparse(node)}")
    return found


def own_members(paths: list[Path]) -> set[str]:
    """Every member the project's classes define or assign on self."""
    own = set()
    for path in paths:
        for node in ast.walk(tree(path)):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                own.add(node.name)
            elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
                own.add(node.attr)
            elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                own.add(node.id)  # class attributes
    return own


def test_no_private_member_of_another_librarys_object_is_read_outside_the_adapters() -> None:
    adapters = {ROOT / a for a in ADAPTERS.values()}
    rest = [p for p in sources() if p not in adapters]
    own = own_members(rest)
    found = [hit for path in rest for hit in reads_of_others_privates(path, own)]
    assert not found, "private members of other libraries, outside the adapters:\n" + "\n".join(
        found
    )


def touched(library: str) -> set[str]:
    """The private names in the library's adapter that the library also has."""
    text = (ROOT / ADAPTERS[library]).read_text()
    names = {m for m in re.findall(r"\b_[a-z]\w*", text)}
    source = library_source(library)
    return {n for n in names if re.search(rf"\.{n}\b|def {n}\b", source)}


@pytest.mark.parametrize("library", sorted(PINNED))
def test_every_private_member_an_adapter_touches_is_pinned(library: str) -> None:
    pinned = {m for m in PINNED[library][1] if private(m)}
    assert touched(library) - pinned == set(), f"touched by {ADAPTERS[library]}, not pinned"
    assert pinned - touched(library) == set(), f"pinned, no longer touched by {ADAPTERS[library]}"


@pytest.mark.parametrize("library", sorted(PINNED))
def test_the_library_is_the_one_its_adapter_was_written_for(library: str) -> None:
    """Fails on any upgrade (or a change of a pinned member's source): re-read each member
    named, adapt the adapter, then update PINNED and DIGESTS (`python tests/test_edges.py`)."""
    version, members = PINNED[library]
    installed = importlib.metadata.version(library)
    changed = sorted(
        f"{member} ({owner})"
        for member, owner in members.items()
        if digest(owner) != DIGESTS[owner]
    )
    assert (installed, changed) == (version, []), (
        f"{ADAPTERS[library]} was written for {library} {version}; {installed} is installed "
        f"and these members it relies on changed: {changed or 'none'}"
    )


def test_the_broker_loads_none_of_the_agents_runtime() -> None:
    """The broker's processes import what they need (addresses, topics), not gmqtt, numpy
    or the agent's state machine."""
    code = (
        "import sys, privnet.broker.__main__, privnet.broker.embedded, privnet.broker.bridge, "
        "privnet.broker.relay; print(sorted(m for m in "
        "('gmqtt', 'numpy', 'privnet.agent.node', 'privnet.agent.transport') "
        "if m in sys.modules))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT
    )
    assert out.stdout.strip() == "[]"


if __name__ == "__main__":  # the digests of the library versions installed, for DIGESTS
    for owner in DIGESTS:
        print(f'    "{owner}": "{digest(owner)}",')
