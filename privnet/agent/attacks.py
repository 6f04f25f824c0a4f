"""What a Byzantine agent sends instead of its model (issue 34), as pure functions.

An attacker follows the protocol on the wire (its real keys, valid sealed frames, its
scheme's noise and masks on top) but chooses the value it releases. It knows its
neighbours' messages only as its scheme lets it see them: what it received at the same
step of the last round (`Seen`). Under `none` those are models; under `random` and `ghp`
models plus Laplace noise; under `local-ghp` and `masked-ghp` each message is masked, and
only the hub's weighted sum is exact. So under the masked schemes ALIE and IPM take their
mean from the attacker's own hub sum (exact: the masks cancel there, less its own term,
which it knows); the messages' spread is the masks' (noise from the pairs' secrets, which
says nothing of the models), so ALIE takes its spread from the one deviation it does
know, its own model's from that mean; dissensus, which needs each receiver's model, has
none to use and sends the mean (harmless). Label flipping changes the agent's data, not
its messages (`flips_labels`, applied where the agent builds its loss).

Every crafted message is kept within norm CAP: the wire refuses a non-finite model, and
an attack whose messages are refused (or that makes its own model overflow through its
neighbours) is no attack, just a crash the deadline handles.

Written as `NAME[:KEY=VALUE,...]`, e.g. `sign-flip`, `alie:z=1.5`, `gaussian:sigma=2`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum

import numpy as np

from privnet.agent import rng
from privnet.agent.spec import ConfigError

CAP = 1e4  # the largest norm of a crafted message


class Kind(StrEnum):
    SIGN_FLIP = "sign-flip"  # -scale * x (Blanchard et al. 2017's classic)
    LARGE_NORM = "large-norm"  # a model of norm `norm` in x's direction
    GAUSSIAN = "gaussian"  # x + N(0, sigma^2 I), a draw per round, step and receiver
    ALIE = "alie"  # mean - z * spread, coordinate-wise (Baruch et al. 2019)
    IPM = "ipm"  # -eps * mean (inner-product manipulation, Xie et al. 2020)
    DISSENSUS = "dissensus"  # pushes each receiver away from its neighbours (He et al. 2022)
    LABEL_FLIP = "label-flip"  # trains on its own data with flipped labels, sends honestly


# Each attack's parameters and their defaults (the only ones it takes).
DEFAULTS: dict[Kind, dict[str, float]] = {
    Kind.SIGN_FLIP: {"scale": 1.0},
    Kind.LARGE_NORM: {"norm": 100.0},
    Kind.GAUSSIAN: {"sigma": 10.0},
    Kind.ALIE: {"z": 1.0},
    Kind.IPM: {"eps": 0.5},
    Kind.DISSENSUS: {"eps": 1.5},
    Kind.LABEL_FLIP: {},
}


@dataclass(frozen=True)
class Attack:
    kind: Kind
    params: dict[str, float] = field(default_factory=dict)

    def __getitem__(self, name: str) -> float:
        return self.params.get(name, DEFAULTS[self.kind][name])

    @property
    def flips_labels(self) -> bool:
        return self.kind is Kind.LABEL_FLIP

    @property
    def crafts(self) -> bool:
        """Whether it changes what it sends (label flipping does not)."""
        return self.kind is not Kind.LABEL_FLIP

    def __str__(self) -> str:
        given = ",".join(f"{k}={v:g}" for k, v in sorted(self.params.items()))
        return f"{self.kind}:{given}" if given else str(self.kind)


def parse_params(text: str, allowed: Mapping[str, float], what: str) -> dict[str, float]:
    """`KEY=VALUE,...` -> {key: float}, each key one of `allowed` (shared with defenses)."""
    out: dict[str, float] = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        key, eq, value = item.partition("=")
        key = key.strip()
        if not eq or key not in allowed:
            names = ", ".join(allowed) or "none"
            raise ConfigError(f"{what}: {item!r} is not KEY=VALUE with KEY one of: {names}")
        try:
            number = float(value)
        except ValueError:
            raise ConfigError(f"{what}: {key}={value!r} is not a number") from None
        if not np.isfinite(number):
            raise ConfigError(f"{what}: {key} must be finite, got {value}")
        out[key] = number
    return out


def parse(text: str) -> Attack:
    """`NAME[:KEY=VALUE,...]` -> Attack; ConfigError naming the attacks otherwise."""
    name, _, rest = text.strip().partition(":")
    try:
        kind = Kind(name.strip())
    except ValueError:
        valid = ", ".join(k.value for k in Kind)
        raise ConfigError(f"attack {text!r}: choose one of {valid}") from None
    return Attack(kind, parse_params(rest, DEFAULTS[kind], f"attack {kind}"))


@dataclass(frozen=True)
class Seen:
    """What an attacker saw at one step of the last round, as its scheme let it see it."""

    messages: dict[int, np.ndarray]  # each neighbour's message as it arrived (none if masked)
    mean: np.ndarray  # its estimate of the neighbours' weighted mean model
    spread: np.ndarray  # coordinate-wise std of the messages (masked: |own - mean|)


def observe(
    weights: Mapping[int, float],
    inbox: Mapping[int, np.ndarray],
    me: int,
    combined: np.ndarray,
    own: np.ndarray | None = None,
) -> Seen | None:
    """The attacker's view of one combine it ran as a hub: `combined` is its own sum
    (exact under every scheme). Unmasked (`own` None), the mean is the weighted mean of the
    messages; masked, the messages hide the models, so it is the hub sum less its own term
    `own` (its release to itself, before masks), and the spread |own - mean|."""
    others = [m for m in weights if m != me]
    if not others:
        return None
    messages = {m: inbox[m] for m in others}
    stacked = np.array([messages[m] for m in others])
    rest = 1.0 - weights[me]
    if own is not None:
        mean = (combined - weights[me] * own) / rest
        return Seen({}, mean, np.abs(own - mean))
    mean = np.array([weights[m] for m in others]) @ stacked / rest
    return Seen(messages, mean, stacked.std(axis=0))


def craft(
    attack: Attack,
    x: np.ndarray,
    seen: Seen | None,
    weights_out: Mapping[int, float],
    me: int,
    noise: np.ndarray | None = None,
) -> dict[int, np.ndarray]:
    """What the attacker releases to every out-neighbour k (its scheme then privatizes it),
    given its own value x and what it saw, each within norm CAP. Before it has seen anything
    (round 1), ALIE, IPM and dissensus send x. `noise` is (agents, dim) standard normals,
    row k for receiver k (Gaussian only)."""
    out = _craft(attack, x, seen, weights_out, me, noise)
    for k, v in out.items():
        norm = float(np.linalg.norm(v))
        if not norm <= CAP:  # NaN too
            out[k] = v * (CAP / norm) if np.isfinite(norm) else np.zeros_like(x)
    return out


def _craft(
    attack: Attack,
    x: np.ndarray,
    seen: Seen | None,
    weights_out: Mapping[int, float],
    me: int,
    noise: np.ndarray | None = None,
) -> dict[int, np.ndarray]:
    targets = [k for k in weights_out if k != me]
    kind = attack.kind
    if kind is Kind.SIGN_FLIP:
        return {k: -attack["scale"] * x for k in targets}
    if kind is Kind.LARGE_NORM:
        norm = float(np.linalg.norm(x))
        direction = x / norm if norm > 0 else np.ones_like(x) / np.sqrt(len(x))
        return {k: attack["norm"] * direction for k in targets}
    if kind is Kind.GAUSSIAN:
        if noise is None:
            raise ValueError("the gaussian attack needs its noise rows")
        return {k: x + attack["sigma"] * noise[k] for k in targets}
    if kind is Kind.LABEL_FLIP or seen is None:
        return {k: x.copy() for k in targets}
    if kind is Kind.ALIE:
        return {k: seen.mean - attack["z"] * seen.spread for k in targets}
    if kind is Kind.IPM:
        return {k: -attack["eps"] * seen.mean for k in targets}
    # dissensus: receiver k combines a_k x_k-ish terms; sending x_k + eps (1 - a)/a (x_k - m)
    # cancels eps times its pull towards its neighbourhood (m: the attacker's estimate of it).
    out = {}
    for k in targets:
        a = weights_out[k]
        x_k = seen.messages.get(k, seen.mean)
        out[k] = x_k + attack["eps"] * (1 - a) / a * (x_k - seen.mean)
    return out


def normals(key: tuple[int, int], step: int, round_: int, agents: int, dim: int) -> np.ndarray:
    """The Gaussian attack's (agents, dim) standard normals for one round and step, from the
    attacker's own key in a domain of its own: the same in every engine."""
    raw = rng.raw_row(key, rng.Domain.ATTACK, step, round_, 2 * agents * dim)
    u = rng.uniforms(raw).reshape(2, agents, dim)
    z: np.ndarray = np.sqrt(-2.0 * np.log(u[0])) * np.cos(2.0 * np.pi * u[1])  # Box-Muller
    return z


def flips(text: str) -> bool:
    """Whether the attack `text` names ("" for none) flips the agent's labels."""
    return bool(text) and parse(text).flips_labels


def flip_labels(y: np.ndarray, classes: int) -> np.ndarray:
    """Label flipping: class c -> classes - 1 - c; a regression target d -> -d."""
    flipped: np.ndarray = (classes - 1 - y) if classes else -y
    return flipped


def parse_byzantine(text: str, agents: int) -> dict[int, Attack]:
    """`IDS:ATTACK[:PARAMS]` groups, `;`-separated, IDS a comma list of ids or ranges
    (`0,4,9:sign-flip;12-14:alie:z=2`) -> {agent: Attack}."""
    out: dict[int, Attack] = {}
    for group in filter(None, (g.strip() for g in text.split(";"))):
        ids, colon, attack = group.partition(":")
        if not colon:
            raise ConfigError(
                f"byzantine {group!r}: write IDS:ATTACK, e.g. 3,7:sign-flip or 0-2:alie:z=1.5"
            )
        for agent in _ids(ids, agents, group):
            if agent in out:
                raise ConfigError(f"byzantine {text!r}: agent {agent} is named twice")
            out[agent] = parse(attack)
    return out


def _ids(text: str, agents: int, group: str) -> list[int]:
    found: list[int] = []
    for item in filter(None, (part.strip() for part in text.split(","))):
        lo, dash, hi = item.partition("-")
        try:
            first, last = int(lo), int(hi if dash else lo)
        except ValueError:
            raise ConfigError(f"byzantine {group!r}: {item!r} is not an id or a range") from None
        if not 0 <= first <= last < agents:
            raise ConfigError(f"byzantine {group!r}: ids must lie in 0..{agents - 1}, got {item}")
        found += range(first, last + 1)
    if not found:
        raise ConfigError(f"byzantine {group!r}: name at least one agent id before the colon")
    return found
