"""The reconstruction attack, adversary by adversary: what each rebuilds from what it reads.

An adversary (privacy.accountant.Adversary) reads some model frames: an outsider only where
links are not sealed, an insider (a hub, a coalition) those addressed to it, knowing its own
values and pair masks; everyone knows the combination matrix, strategy, scheme and mu. Per
round and step the attack solves for the senders' releases by least squares: each frame
read observes one (plus its noise, or masks weighted by a_mk); under the masked schemes the
frames into a hub it reads whole sum to the releases exactly (Mrini, Cyffers and Bellet,
ICML 2024); an insider holding every mask of a frame reads it. From the trajectory it
estimates each fully read agent's local minimizer (ATC: an affine fit of its gradients);
an agent it reads nothing of is estimated as 0.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
from rich.table import Table
from scipy.linalg import lstsq, null_space

from privnet.agent import lattice
from privnet.agent import schedule as expand
from privnet.agent.seats import split_senders
from privnet.agent.spec import ConfigError, Scheme, Strategy, WireDtype
from privnet.orchestrator.experiment import data
from privnet.orchestrator.experiment.instance import Instance
from privnet.orchestrator.privacy.accountant import Adversary
from privnet.orchestrator.terminal import titled_table

Seen = Mapping[tuple[int, int, int, int], np.ndarray]  # (sender, receiver, round, step)
# A trajectory within this relative error counts as recovered: exact up to the lattice the
# masked schemes release on (each term rounded to 2^-20 of the noise scale; none: 1e-15).
RECOVERED = 1e-6
WIRE = Adversary("wire")


def reconstruct(
    problem: Instance,
    strategy: Strategy,
    scheme: Scheme,
    seen: Seen,
    adversary: Adversary = WIRE,
    known: Seen | None = None,
) -> dict[tuple[int, int, int], np.ndarray]:
    """Estimates of the releases y[(sender, round, step)] from the frames of `seen` that
    `adversary` reads; `known`: the releases it knows exactly, by frame (an insider's own,
    and those whose masks it holds: `insider_knowledge`)."""
    known = known or {}
    by_slot: dict[tuple[int, int], list[tuple[int, int, np.ndarray]]] = {}
    for (m, k, i, step), vector in seen.items():
        if adversary.reads(m, k):
            by_slot.setdefault((i, step), []).append((m, k, np.asarray(vector)))
    out = {}
    static = problem.matrices(strategy) if problem.schedule is None else None
    for (i, step), links in by_slot.items():
        a = (static or problem.round_matrices(strategy, i))[step]  # a schedule's: round i's
        senders = sorted({m for m, _, _ in links})
        column = {m: n for n, m in enumerate(senders)}
        rows = np.zeros((len(links), len(senders)))
        weights = np.ones(len(links))
        for r, (m, k, _) in enumerate(links):
            rows[r, column[m]] = 1.0
            if scheme.masked:
                weights[r] = a[m, k]
        values = np.array([v for *_, v in links])
        exact, sums = (
            _exact(a, links, column, (i, step), known, _words(problem))
            if scheme.masked
            else (None, None)
        )
        y = _solve(rows * weights[:, None], values * weights[:, None], exact, sums)
        out.update({(m, i, step): y[column[m]] for m in senders})
    return out


def _exact(
    a: np.ndarray,
    links: list[tuple[int, int, np.ndarray]],
    column: dict[int, int],
    slot: tuple[int, int],
    known: Seen,
    words: float = 0.0,
) -> tuple[np.ndarray | None, np.ndarray | None]:
    """The masked schemes' exact constraints of one slot: sum_l a_lk y_l = sum_l a_lk
    (frame l -> k) at every hub with 2+ other neighbours whose every frame is in `links`
    (the masks cancel there: mod 2^32 on the u4 wire, whose lattice step `words` is), and
    y_m itself for every frame of it in `known`."""
    into: dict[int, list[tuple[int, np.ndarray]]] = {}
    for m, k, v in links:
        into.setdefault(k, []).append((m, v))
    rows, sums = [], []
    for k, heard in sorted(into.items()):
        if len(heard) < 2 or len(heard) < np.count_nonzero(a[:, k]) - 1:
            continue  # a sole neighbour pairs with the hub, or a frame is missing: masked
        row = np.zeros(len(column))
        for m, _ in heard:
            row[column[m]] = a[m, k]
        rows.append(row)
        total = sum(a[m, k] * v for m, v in heard)
        sums.append(lattice.wrapped(total, words) if words else total)
    for (m, _k, i, step), v in sorted(known.items(), key=lambda item: item[0]):
        if (i, step) == slot:
            row = np.zeros(len(column))
            row[column[m]] = 1.0
            rows.append(row)
            sums.append(np.asarray(v))
    return (np.array(rows), np.array(sums)) if rows else (None, None)


def _words(problem: Instance) -> float:
    """The lattice step of a u4 run's words (a hub's sums are taken mod 2^32), 0 on f8."""
    if problem.wire is not WireDtype.U4:
        return 0.0
    return lattice.grid(problem.config.sigma_g, problem.wire)


def insider_knowledge(
    problem: Instance,
    strategy: Strategy,
    scheme: Scheme,
    adversary: Adversary,
    released: Seen,
) -> dict[tuple[int, int, int, int], np.ndarray]:
    """The releases an insider knows exactly, by frame (sender, receiver, round, step):
    its members' own into its hubs, and, under a masked scheme, any whose every pair mask
    it holds (the sender's partners at that member hub all members). `released`: every
    frame's release, from the replay (`replay.Replay.released`)."""
    if not adversary.insider:
        return {}
    seats = {}
    out = {}
    made = problem.schedule
    for (m, k, i, step), v in released.items():
        if m == k or k not in adversary.members:
            continue
        at = (k, step, 0 if made is None else expand.index(made, i))  # a schedule's graph
        if at not in seats:
            a = problem.round_matrices(strategy, i)[step]
            heard = [int(s) for s in np.flatnonzero(a[:, k]) if s != k]
            seats[at] = split_senders(heard, k) if heard else {}
        seat = seats[at].get(m)
        holds = scheme.masked and seat is not None and set(seat.partners) <= adversary.members
        if m in adversary.members or holds:
            out[(m, k, i, step)] = v
    return out


def _solve(rows, values, exact, sums) -> np.ndarray:
    """Least squares for `rows y = values`, subject to `exact y = sums` when given."""
    if exact is None:
        return lstsq(rows, values)[0]
    pinned = lstsq(exact, sums)[0]
    free = null_space(exact)
    if free.shape[1] == 0:
        return pinned
    z = lstsq(rows @ free, values - rows @ pinned)[0]
    return pinned + free @ z


def local_minimizers(problem: Instance, repeat: int) -> np.ndarray:
    """The true argmin J_p of every agent, (P, M) (NaN rows: the problem has no reference)."""
    dim = problem.config.dim
    found = [
        data.reference(problem.plugin, [risk], [part], dim)
        for risk, part in zip(problem.risks(repeat), problem.parts(repeat), strict=True)
    ]
    return np.array([np.full(dim, np.nan) if w is None else w for w in found])


def estimate_minimizers(
    problem: Instance,
    estimate: dict[tuple[int, int, int], np.ndarray],
    seen: Seen,
    dim: int | None = None,
) -> np.ndarray:
    """ATC: the root of an affine fit of grad J_p against phi_p over the rounds (`dim`:
    the coordinates the frames hold, a sample's; the model's by default)."""
    c = problem.config
    dim = c.dim if dim is None else dim
    out = np.full((c.agents, dim), np.nan)
    for p in range(c.agents):
        phis, grads = [], []
        for i in range(1, c.iters + 1):
            if (p, i, 2) not in estimate:
                continue
            a = problem.round_matrix(i - 1)  # the combine that made round i's phi
            if i == 1:
                phi = np.zeros(dim)  # w_0
            else:
                heard = [m for m in range(c.agents) if a[m, p] > 0]
                if (p, i - 1, 2) not in estimate or any(
                    m != p and (m, p, i - 1, 2) not in seen for m in heard
                ):
                    continue  # a term of phi unseen (under a schedule: another round's peer)
                phi = sum(
                    a[m, p] * (estimate[(p, i - 1, 2)] if m == p else seen[(m, p, i - 1, 2)])
                    for m in heard
                )
            phis.append(phi)
            grads.append((phi - estimate[(p, i, 2)]) / c.mu)
        if len(phis) > dim:
            design = np.hstack([np.array(phis), -np.ones((len(phis), 1))])
            coef = lstsq(design, np.array(grads))[0]  # grad = phi @ H^T - r
            h_t, r = coef[:-1], coef[-1]
            out[p] = lstsq(h_t.T, r)[0]
    return out


def attack_session(
    problem: Instance,
    strategy: Strategy,
    scheme: Scheme,
    repeat: int,
    seen: Seen,
    clear: Mapping[tuple[int, int, int], np.ndarray],
    adversary: Adversary = WIRE,
    known: Seen | None = None,
    attacked: int = 0,
    pick: np.ndarray | None = None,
) -> dict[str, Any]:
    """Per-agent relative errors of what `adversary` rebuilds (trajectory, local
    minimizer) of every agent outside it, agent `attacked`'s apart; `known` as for
    `reconstruct`; `pick`: the coordinates the frames and `clear` hold (a big model's
    audit sample), the whole model when None."""
    known = known or {}
    visible = {s: v for s, v in seen.items() if adversary.reads(s[0], s[1])}
    estimate = reconstruct(problem, strategy, scheme, seen, adversary, known)
    c = problem.config
    targets = [p for p in range(c.agents) if p not in adversary.members]
    errors: list[float | None] = [None] * c.agents
    for p in targets:
        keys = [key for key in clear if key[0] == p]
        truth = np.array([clear[key] for key in keys])
        guess = np.array([estimate.get(key, np.zeros_like(clear[key])) for key in keys])
        scale = max(float(np.linalg.norm(truth)), 1e-300)
        errors[p] = float(np.linalg.norm(guess - truth)) / scale
    theirs = np.array([errors[p] for p in targets])
    record: dict[str, Any] = {
        "strategy": str(strategy),
        "scheme": str(scheme),
        "repeat": repeat,
        "adversary": str(adversary),
        "kind": adversary.kind,
        "sealed": adversary.sealed,
        "members": sorted(adversary.members),
        "frames_read": sum(1 for s in seen if adversary.reads(s[0], s[1])),
        "trajectory_rel_error": errors,
        "trajectory_rel_error_median": float(np.median(theirs)),
        "trajectory_rel_error_max": float(np.max(theirs)),
        "agents_recovered": int(np.sum(theirs < RECOVERED)),
        "agents": len(targets),
        "attacked_agent": attacked,
        "attacked_trajectory_rel_error": errors[attacked],
    }
    if strategy is Strategy.ATC:
        truth = local_minimizers(problem, repeat)
        if pick is not None:
            truth = truth[:, pick]
        guess = estimate_minimizers(problem, estimate, visible, truth.shape[1])
        rel = np.linalg.norm(np.nan_to_num(guess) - truth, axis=1) / np.linalg.norm(truth, axis=1)
        record["minimizer_rel_error"] = [
            None if p in adversary.members else float(e) for p, e in enumerate(rel)
        ]
        record["minimizer_rel_error_median"] = float(np.median(rel[targets]))
        record["attacked_minimizer_rel_error"] = float(rel[attacked])
    record["pinned_directions"] = pinned_directions(problem, strategy, scheme, adversary)
    recovered = record["agents_recovered"]
    record["broken"] = recovered == len(targets)
    record["verdict"] = (
        "broken"
        if record["broken"]
        else f"partly broken: {recovered} of {len(targets)} agents"
        if recovered
        else "not broken"
    )
    return record


def pinned_directions(
    problem: Instance, strategy: Strategy, scheme: Scheme, adversary: Adversary = WIRE
) -> int:
    """How many of the P unknowns per step the whole wire's exact hub sums fix (masked
    schemes, their frames readable; else 0)."""
    if not scheme.masked or adversary.kind != "wire" or adversary.sealed:
        return 0
    a = problem.round_matrix(1)  # the communicating step's (a schedule's: round 1's)
    b = a.T - np.diag(np.diag(a))
    return int(np.linalg.matrix_rank(b[(b > 0).sum(axis=1) >= 2]))


def adversaries(
    problem: Instance, agent: int, coalition: tuple[int, ...] | None = None
) -> list[Adversary]:
    """The table's adversaries for agent `agent`'s data: the link to its largest hub (the
    neighbour that weighs it most) and the whole wire, each sealed and open; that hub; and
    `coalition` (default: the two neighbours that weigh it most)."""
    c = problem.config
    if not 0 <= agent < c.agents:
        raise ConfigError(f"agent {agent} is not in [0, {c.agents}): pick one of the run's agents")
    row = problem.A[agent].copy()  # the matrix of the communicating step, for every strategy
    row[agent] = 0.0
    hub = int(np.argmax(row))
    if coalition is None:
        coalition = tuple(int(k) for k in np.argsort(-row)[:2] if row[k] > 0)
    if agent in coalition or not all(0 <= m < c.agents for m in coalition) or not coalition:
        raise ConfigError(
            f"coalition {list(coalition)}: name agents in [0, {c.agents}) other than agent "
            f"{agent}, whose data it attacks (e.g. --coalition 3,7)"
        )
    return [
        Adversary("link", sender=agent, receiver=hub, sealed=True),
        Adversary("link", sender=agent, receiver=hub),
        Adversary("hub", frozenset({hub})),
        Adversary("coalition", frozenset(coalition)),
        Adversary("wire", sealed=True),
        Adversary("wire"),
    ]


def attack_table(records: list[dict[str, Any]]) -> Table:
    """The whole wire's attack, one row per session (the sessions of `audit.json`'s
    `reconstruction`)."""
    table = titled_table(
        "reconstruction attack: an eavesdropper with the whole wire (open) and A",
        (
            "session",
            "recovered",
            "pinned",
            "traj. err (median)",
            "traj. err (max)",
            "argmin J_p err (median)",
            "verdict",
        ),
        left=1,
    )
    for r in records:
        table.add_row(
            f"{r['strategy']}/{r['scheme']} r{r['repeat']}",
            f"{r['agents_recovered']}/{r['agents']}",
            f"{r['pinned_directions']}/{r['agents']}",
            f"{r['trajectory_rel_error_median']:.3g}",
            f"{r['trajectory_rel_error_max']:.3g}",
            f"{r['minimizer_rel_error_median']:.3g}" if "minimizer_rel_error_median" in r else "–",
            r["verdict"],
        )
    return table


def adversary_table(records: list[dict[str, Any]], agent: int) -> Table:
    """Per scheme x adversary: what it reads and rebuilds, and the epsilon that holds
    against it for agent `agent`'s data (`audit.json`'s `adversaries`)."""
    table = titled_table(
        f"who learns what: per scheme and adversary (agent {agent} attacked; epsilon for its data)",
        (
            "scheme",
            "adversary",
            "frames read",
            "recovered",
            f"traj. err {agent}",
            "traj. err (median)",
            f"argmin J_{agent} err",
            "epsilon",
            "wire",
        ),
        left=2,
    )
    for r in records:
        eps, minimizer = r["epsilon"], r.get("attacked_minimizer_rel_error")
        table.add_row(
            f"{r['strategy']}/{r['scheme']}" + (f" r{r['repeat']}" if r["repeat"] else ""),
            r["adversary"],
            str(r["frames_read"]),
            f"{r['agents_recovered']}/{r['agents']}",
            f"{r['attacked_trajectory_rel_error']:.3g}",
            f"{r['trajectory_rel_error_median']:.3g}",
            "–" if minimizer is None else f"{minimizer:.3g}",
            eps if isinstance(eps, str) else f"{eps:.4g}",
            r.get("wire", ""),
        )
    return table
