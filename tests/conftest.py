"""Fixtures shared by the tests that need a real broker."""

import os

import pytest

from broker.launcher import has_mosquitto

BROKER_KINDS = ("mosquitto", "embedded")


def need_mosquitto() -> None:
    """Skip without mosquitto, except in CI (PRIVNET_REQUIRE_MOSQUITTO=1), where it is a failure."""
    if has_mosquitto():
        return
    if os.environ.get("PRIVNET_REQUIRE_MOSQUITTO") == "1":
        pytest.fail("PRIVNET_REQUIRE_MOSQUITTO=1 but mosquitto is not installed: install it")
    pytest.skip("mosquitto is not installed (apt-get install mosquitto); embedded variants run")


@pytest.fixture(scope="module", params=BROKER_KINDS)
def broker_kind(request: pytest.FixtureRequest) -> str:
    """Each broker privnet can launch (module scope: pytest groups a module's tests by broker)."""
    if request.param == "mosquitto":
        need_mosquitto()
    return str(request.param)


@pytest.fixture
def needs_mosquitto() -> None:
    """For tests about mosquitto itself (its $SYS counters, say)."""
    need_mosquitto()
