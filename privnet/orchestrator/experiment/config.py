"""Experiment configuration: one dataclass, loaded from TOML, overridden by CLI flags."""

from __future__ import annotations

import math
import os
import tomllib
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field, fields, replace
from enum import StrEnum
from importlib import resources
from pathlib import Path
from typing import Any, TypeVar

from privnet.agent import attacks, datasets, defenses, plugins, problems
from privnet.agent.spec import (
    LOCAL_STEPS,
    ConfigError,
    Rekey,
    Scheme,
    Strategy,
    WireDtype,
    check_local_steps,
)
from privnet.orchestrator.experiment import partition


@dataclass(frozen=True)
class ExperimentConfig:
    """Defaults are the paper's section V-A (one repeat; the preset asks for 20)."""

    name: str = "paper-regression"
    agents: int = 30
    dim: int = 2
    samples: int = 100
    rho: float = 0.01
    batch: int | None = None  # None: full batch (exact local gradients)
    mu: float = 0.4
    local_steps: int = LOCAL_STEPS  # E: local gradient steps a round before combining
    sigma_g2: float = 0.01
    iters: int = 1000
    repeats: int = 1
    seed: int = 1
    strategies: tuple[Strategy, ...] = (Strategy.CONSENSUS, Strategy.ATC, Strategy.CTA)
    schemes: tuple[Scheme, ...] = tuple(Scheme)
    topology: str = "geometric"
    radius: float | None = None
    edges: str | None = None  # edge-list file for topology = "file"
    rule: str = "metropolis"
    matrix: str | None = None  # a user-given combination matrix (overrides rule)
    rekey: Rekey = Rekey.ONCE
    # The problem plug-in (privnet.agent.problems): least-squares, logistic, mlp, a registered name
    # or module:Class (the paper's `regression` and `classification` name the first two),
    # built with `params` (and `rho`, when it takes one).
    problem: str = "least-squares"
    params: dict[str, Any] = field(default_factory=dict)
    dataset: str | None = None  # linear (generated) or a dataset; None: the problem's own
    partition: str = (
        "iid"  # how a dataset's rows are dealt out (privnet.orchestrator.experiment.partition)
    )
    feature_noise: float = 0.5  # datasets: agent p's feature noise std ~ U[0, this]
    seal_links: bool = True  # peer frames sealed end to end (False: the paper's visible wire)
    # Issue 34: Byzantine agents, IDS:ATTACK[:PARAMS] groups `;`-separated (privnet.agent.
    # attacks), and the defense every honest hub runs, NAME[:PARAMS] (privnet.agent.defenses)
    byzantine: str = ""
    defense: str = "none"
    # How releases travel: f8 (float64) or u4 (lattice words mod 2^32, privnet.agent.lattice);
    # None: the problem's dtype (float64 -> f8, float32 -> u4), set when the Problem is built
    wire_dtype: WireDtype | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self._coerce()
        checks = [
            (self.agents >= 2, f"agents must be >= 2, got {self.agents}"),
            (self.dim >= 1, f"dim must be >= 1, got {self.dim}"),
            (self.samples >= 1, f"samples must be >= 1, got {self.samples}"),
            (self.iters >= 1, f"iters must be >= 1, got {self.iters}"),
            (self.repeats >= 1, f"repeats must be >= 1, got {self.repeats}"),
            (self.mu > 0 and math.isfinite(self.mu), f"mu must be > 0, got {self.mu}"),
            (
                self.sigma_g2 >= 0 and math.isfinite(self.sigma_g2),
                f"sigma_g2 must be >= 0, got {self.sigma_g2}",
            ),
            (self.rho >= 0 and math.isfinite(self.rho), f"rho must be >= 0, got {self.rho}"),
            (self.batch is None or self.batch >= 1, f"batch must be >= 1, got {self.batch}"),
            (
                self.feature_noise >= 0 and math.isfinite(self.feature_noise),
                f"feature_noise must be >= 0, got {self.feature_noise}",
            ),
            (bool(self.strategies), "choose at least one strategy"),
            (bool(self.schemes), "choose at least one scheme"),
            (
                type(self.seal_links) is bool,
                f"seal_links must be true or false, got {self.seal_links!r}",
            ),
        ]
        for ok, message in checks:
            if not ok:
                raise ConfigError(message)
        check_local_steps(self.local_steps)
        plugins.check_name("problem", self.problem)
        if self.dataset is not None:
            datasets.check_name(self.dataset)
        partition.check(self.partition)
        problems.params(self.params)  # numbers, strings, booleans and lists only
        self.attackers()
        for scheme in self.schemes:
            defenses.parse(self.defense, scheme)
        need, have = self.footprint(), _memory()
        if have is not None and need > have:
            raise ConfigError(
                f"this experiment needs at least {need / 2**30:.0f} GiB (agents^2 weights, "
                f"agents x dim^2 moments (least-squares), agents x samples x dim data "
                f"(least-squares, logistic), iters x agents x dim models) and this machine "
                f"has {have / 2**30:.0f} GiB: lower agents, dim, "
                "samples or iters"
            )

    def _coerce(self) -> None:
        """Names as a user writes them (`"atc"`, `"all"`, `"none,local-ghp"`, `"once"`, the
        paper's problem names) as the members and names privnet runs."""
        coerced = {
            "strategies": parse_choices(self.strategies, Strategy),
            "schemes": parse_choices(self.schemes, Scheme),
            "rekey": _member(self.rekey, Rekey),
            "wire_dtype": None if self.wire_dtype is None else _member(self.wire_dtype, WireDtype),
            "problem": problems.ALIASES.get(self.problem, self.problem),
        }
        for name, value in coerced.items():
            object.__setattr__(self, name, value)

    def footprint(self) -> int:
        """Bytes of the dense arrays any engine holds at once (a lower bound): what a config
        too large for the machine is refused by, before anything is allocated."""
        linear = self.problem in ("least-squares", "logistic")  # dim is the data's width
        moments = self.dim if self.problem == "least-squares" else 0  # (dim, dim) per agent
        floats = (
            3 * self.agents**2
            + self.agents * self.dim * (moments + (self.samples if linear else 0))
            + self.iters * self.agents * self.dim
        )
        return 8 * floats

    def attackers(self) -> dict[int, attacks.Attack]:
        """The Byzantine agents and their attacks (ConfigError for a bad `byzantine`)."""
        found = attacks.parse_byzantine(self.byzantine, self.agents)
        if len(found) >= self.agents:
            raise ConfigError(f"byzantine {self.byzantine!r}: leave at least one agent honest")
        return found

    @property
    def sigma_g(self) -> float:
        return math.sqrt(self.sigma_g2)

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["strategies"] = [str(s) for s in self.strategies]
        data["schemes"] = [str(s) for s in self.schemes]
        data["rekey"] = str(self.rekey)
        data["wire_dtype"] = None if self.wire_dtype is None else str(self.wire_dtype)
        return data


E = TypeVar("E", Strategy, Scheme)  # the choices a config lists by name
M = TypeVar("M", bound=StrEnum)
_FIELDS = {f.name for f in fields(ExperimentConfig)}
_FIELD_TYPES = {f.name: f.type for f in fields(ExperimentConfig)}


def parse_choices(value: str | Iterable[str], kind: type[E]) -> tuple[E, ...]:
    """'all', one name, a comma list or a list (of names or members) -> a tuple of members."""
    names = value.split(",") if isinstance(value, str) else list(value)
    what = kind.__name__.lower()
    if names == ["all"]:
        return tuple(kind)
    try:
        chosen = tuple(kind(n.strip()) for n in names)
    except ValueError:
        valid = ", ".join(str(k) for k in kind)
        raise ConfigError(f"unknown {what} in {value!r}; choose from: {valid}, all") from None
    if not chosen:
        raise ConfigError(f"choose at least one {what}")
    return chosen


def _member(value: str, kind: type[M]) -> M:
    try:
        return kind(value)
    except ValueError:
        valid = ", ".join(str(k) for k in kind)
        raise ConfigError(
            f"unknown {kind.__name__.lower()} {value!r}; choose from: {valid}"
        ) from None


def _memory() -> int | None:
    """This machine's physical memory in bytes (None: unknown)."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


# The plain type each setting takes (None, where a field allows it, means "not given").
_TYPES = {"int": int, "float": float, "str": str, "bool": bool, "dict[str, Any]": dict}


def _typed(key: str, value: Any) -> Any:
    """`value` as setting `key` takes it (an int where a float goes), or a ConfigError."""
    if key in ("strategies", "schemes"):
        kind = Strategy if key == "strategies" else Scheme
        names_ok = isinstance(value, str) or (
            isinstance(value, list | tuple) and all(isinstance(v, str) for v in value)
        )
        if not names_ok:
            raise ConfigError(f"{key} = {value!r}: give a name, a comma list or a list of names")
        return parse_choices(value, kind)
    if key in ("rekey", "wire_dtype"):
        member: type[StrEnum] = Rekey if key == "rekey" else WireDtype
        try:
            return member(value)
        except (ValueError, TypeError):
            choices = ", ".join(str(r) for r in member)
            raise ConfigError(f"{key} = {value!r}: choose {choices}") from None
    want = _TYPES[str(_FIELD_TYPES[key]).removesuffix(" | None")]
    if want is bool:  # ExperimentConfig checks it, saying so
        return value
    if want is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if not isinstance(value, want) or isinstance(value, bool):
        article = {int: "an integer", float: "a number", str: "text", dict: "a table"}[want]
        raise ConfigError(f"{key} = {value!r}: give {article}")
    return value


def with_overrides(config: ExperimentConfig, overrides: dict[str, Any]) -> ExperimentConfig:
    """Apply non-None overrides (CLI flags, TOML tables), each checked for its type and
    names coerced to enums."""
    clean: dict[str, Any] = {}
    for key, value in overrides.items():
        if value is None:
            continue
        key = key.replace("-", "_")
        if key not in _FIELDS:
            raise ConfigError(
                f"unknown setting {key!r}; valid settings: {', '.join(sorted(_FIELDS))}"
            )
        clean[key] = _typed(key, value)
    return replace(config, **clean)


PRESETS = resources.files(__package__ or "privnet.orchestrator.experiment") / "presets"


def presets() -> list[str]:
    """Names of the experiment presets shipped in the package (usable as `--config NAME`)."""
    return sorted(
        f.name.removesuffix(".toml") for f in PRESETS.iterdir() if f.name.endswith(".toml")
    )


def load(source: str | Path | None) -> ExperimentConfig:
    """Read a TOML experiment (flat keys, or an [experiment] table); defaults when None.

    `source` is a file path, or the name of a shipped preset (`paper-regression`): presets are
    package data, so they work from an installed wheel in any directory. A file wins over a
    preset of the same name.
    """
    if source is None:
        return ExperimentConfig()
    path = Path(source)
    name = str(source).removesuffix(".toml")
    preset = PRESETS / f"{name}.toml"
    if path.is_file():
        text = path.read_text()
    elif path.parent == Path(".") and preset.is_file():
        text = preset.read_text()
    else:
        raise ConfigError(
            f"config {source!r} is neither a TOML file nor a preset; "
            f"give a path to a .toml file or one of the presets: {', '.join(presets())}"
        )
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{source} is not valid TOML: {exc}") from exc
    data = data.get("experiment", data)
    return with_overrides(ExperimentConfig(name=Path(name).name), data)
