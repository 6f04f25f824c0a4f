"""The agents' C allocator: jemalloc preloaded into the zygote where installed, glibc's on
request, and a clear refusal for a word it does not know or a jemalloc it cannot find."""

from __future__ import annotations

import pytest

from privnet.agent.spec import ConfigError
from privnet.orchestrator.engines import allocator
from privnet.orchestrator.engines.allocator import DECAY, ENV, JEMALLOC, Allocator


def test_unset_means_auto() -> None:
    assert allocator.chosen({}) is Allocator.AUTO


def test_an_unknown_allocator_is_refused_with_the_choices() -> None:
    with pytest.raises(ConfigError, match=r"PRIVNET_ALLOCATOR='tcmalloc': choose one of auto, "):
        allocator.preload({ENV: "tcmalloc"})


def test_system_leaves_the_environment_as_it_is() -> None:
    env = {ENV: "system", "LD_PRELOAD": "libfoo.so"}
    assert allocator.preload(env) == env


def test_jemalloc_goes_first_and_keeps_what_was_preloaded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(allocator, "installed", lambda: True)
    env = allocator.preload({"LD_PRELOAD": "libfoo.so", "HOME": "/h"})
    assert env == {"LD_PRELOAD": f"{JEMALLOC} libfoo.so", "HOME": "/h", "MALLOC_CONF": DECAY}
    assert allocator.preload(env) == env  # not added twice


def test_the_users_jemalloc_settings_win(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(allocator, "installed", lambda: True)
    assert allocator.preload({"MALLOC_CONF": "narenas:1"})["MALLOC_CONF"] == "narenas:1"


def test_auto_without_jemalloc_runs_on_glibc(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(allocator, "installed", lambda: False)
    assert allocator.preload({"HOME": "/h"}) == {"HOME": "/h"}


def test_jemalloc_asked_for_but_missing_says_how_to_get_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(allocator, "installed", lambda: False)
    with pytest.raises(ConfigError, match=r"apt-get install libjemalloc2"):
        allocator.preload({ENV: "jemalloc"})
