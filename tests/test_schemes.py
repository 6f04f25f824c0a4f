"""The privacy schemes as parts (issue 33): a sixth scheme is one class and its
registration, run here through the agents' own cores (the memory engine) without editing
privnet; the registry's names and errors; privnet's own parts keep the facts the engines
relied on; and no module outside the registry, the scheme modules and the CLI names a
scheme (the issue's must-show, kept true by a scan of the sources)."""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from pathlib import Path

import numpy as np
import pytest

from privnet.agent.schemes import registry
from privnet.agent.schemes.base import Draws, SchemePart, Source
from privnet.agent.spec import AgentSpec, ConfigError, Scheme, Strategy
from privnet.agent.wire.schema import kind_of
from privnet.orchestrator.engines.memory import run_session
from privnet.orchestrator.engines.oracle import run_oracle
from privnet.orchestrator.experiment.config import ExperimentConfig
from privnet.orchestrator.experiment.instance import Instance
from privnet.orchestrator.replay import replay

ROOT = Path(__file__).resolve().parent.parent
OFFSET = 0.25
BUILTIN = ("none", "random", "ghp", "local-ghp", "masked-ghp")


class Offset(SchemePart):
    """A test scheme: +c on every link and -(1 - a_pp)/a_pp c on the self-term, so a hub's
    sum gains c (sum_{m != p} a_mp - (1 - a_pp)) = 0 (the columns of A sum to 1): the
    models follow none's while no frame carries a model as it is."""

    name = "offset"
    homomorphic = True  # the self-term divides by a_pp

    def release(
        self, x: np.ndarray, out: Mapping[int, float], me: int, source: Source
    ) -> dict[int, np.ndarray]:
        a = out[me]
        return {k: x - (1 - a) / a * OFFSET if k == me else x + OFFSET for k in out}


class MaskedOffset(Offset):
    """The same release under the core's pairwise masks (keys agreed, lattice sums)."""

    name = "masked-offset"
    masked = True


@pytest.fixture(params=[Offset, MaskedOffset])
def offset(request: pytest.FixtureRequest) -> Iterator[Scheme]:
    scheme = registry.register(request.param())
    try:
        yield scheme
    finally:
        registry.unregister(scheme)


def small(scheme: str) -> Instance:
    return Instance.build(ExperimentConfig(agents=6, iters=8, repeats=1, seed=3, schemes=(scheme,)))


def test_a_registered_scheme_runs_on_the_agents_own_cores(offset: Scheme) -> None:
    problem = small(str(offset))
    got = run_session(problem, Strategy.ATC, offset, 0).models
    want = run_session(small("none"), Strategy.ATC, Scheme.NONE, 0).models
    assert got.shape == want.shape == (8, 6, 2)
    # masked: every term is rounded to the noise grid, so the models agree to its size
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-6 if offset.masked else 1e-12)
    seen = replay(problem, Strategy.ATC, offset)
    offsets = [
        released - seen.views[(v, m, i, j)]
        for (v, m, k, i, j), released in seen.released.items()
        if k != m
    ]
    assert offsets and np.allclose(offsets, OFFSET, rtol=0, atol=1e-12)  # the part's release


def test_the_oracle_refuses_a_scheme_it_does_not_model(offset: Scheme) -> None:
    with pytest.raises(ConfigError, match=f"does not model scheme {offset}.*--engine memory"):
        run_oracle(small(str(offset)))


def test_a_registered_name_is_a_scheme_everywhere(offset: Scheme) -> None:
    assert Scheme(str(offset)) is offset and offset in list(Scheme)
    assert offset.masked is offset.part.masked and offset.homomorphic
    assert str(ExperimentConfig(schemes=(str(offset),)).schemes[0]) == str(offset)
    kind = kind_of(Scheme)
    assert kind.decode(kind.encode(offset), "scheme") is offset  # the wire: the plain name
    assert type(kind.encode(offset)) is str


def test_an_unknown_name_lists_the_registered_ones(offset: Scheme) -> None:
    listed = ", ".join([*BUILTIN, str(offset)])
    with pytest.raises(ConfigError, match=f"unknown scheme 'lgp'; choose one of {listed}"):
        Scheme("lgp")
    with pytest.raises(ConfigError, match=f"unknown scheme in .*'lgp'.*{offset}"):
        ExperimentConfig(schemes=("lgp",))


def test_registration_refuses_a_taken_or_malformed_name_and_keeps_privnets_own() -> None:
    class Taken(Offset):
        name = "ghp"

    class Shouting(Offset):
        name = "Offset!"

    with pytest.raises(ConfigError, match="'ghp' is registered already"):
        registry.register(Taken())
    with pytest.raises(ConfigError, match="lowercase letters"):
        registry.register(Shouting())
    with pytest.raises(ConfigError, match="privnet's own"):
        registry.unregister("ghp")
    with pytest.raises(ConfigError, match="not registered"):
        registry.unregister("offset")
    assert tuple(Scheme) == BUILTIN


def test_privnets_own_parts_keep_the_facts_the_engines_relied_on() -> None:
    """What the enum said (masked, homomorphic) and which noise each draws; the order
    every table and figure uses; a spec given the plain name runs the registered part."""
    assert [s for s in Scheme if s.masked] == ["local-ghp", "masked-ghp"]
    assert [s for s in Scheme if s.homomorphic] == ["ghp", "masked-ghp"]
    draws = {str(s): s.part.draws for s in Scheme}
    assert draws == {
        "none": Draws.NONE,
        "random": Draws.PER_LINK,
        "ghp": Draws.PER_SENDER,
        "local-ghp": Draws.NONE,
        "masked-ghp": Draws.PER_SENDER,
    }
    assert all(s.part.oracle and s.part.style["label"] for s in Scheme)
    assert [s for s in Scheme if not s.part.hides] == ["none"]
    spec_field = AgentSpec.__dataclass_fields__["scheme"]
    assert spec_field.type in ("Scheme", Scheme)


# ---- the must-show: no branch on a scheme's name outside the registry and the CLI --------

NAMES_ALLOWED = ("privnet/agent/schemes/", "privnet/orchestrator/cli.py",
    "privnet/orchestrator/flags.py", "privnet/orchestrator/commands/")  # fmt: skip
SPELLED = re.compile(r"\bScheme\.[A-Z_]+\b")
QUOTED = "|".join(re.escape(n) for n in BUILTIN)
COMPARED = re.compile(
    rf"scheme[\w.]*\s*(==|!=|\bis\b|\bin\b)\s*[\(\[{{]?[^#]*['\"]({QUOTED})['\"]"
    rf"|['\"]({QUOTED})['\"]\s*(==|!=|\bin\b)\s*\w*scheme",
    re.IGNORECASE,
)


def named_schemes(root: Path) -> list[str]:
    """Lines under privnet/ outside the allowed files that spell a scheme (Scheme.GHP) or
    compare a scheme with a scheme's name ("ghp")."""
    found = []
    for path in sorted((root / "privnet").rglob("*.py")):
        where = path.relative_to(root).as_posix()
        if where.startswith(NAMES_ALLOWED):
            continue
        for n, line in enumerate(path.read_text().splitlines(), 1):
            if SPELLED.search(line) or COMPARED.search(line):
                found.append(f"{where}:{n}: {line.strip()}")
    return found


def test_no_module_outside_the_registry_and_the_cli_names_a_scheme() -> None:
    assert named_schemes(ROOT) == []


def test_the_scan_finds_a_branch_on_a_name(tmp_path: Path) -> None:
    (tmp_path / "privnet" / "agent").mkdir(parents=True)
    (tmp_path / "privnet" / "agent" / "x.py").write_text(
        "if spec.scheme is Scheme.RANDOM:\n    pass\n"
        "if scheme == 'local-ghp':\n    pass\n"
        "ok = scheme.part.masked\n"
    )
    assert [line.split(": ", 1)[0] for line in named_schemes(tmp_path)] == [
        "privnet/agent/x.py:1",
        "privnet/agent/x.py:3",
    ]
