"""A session's membership views as the audit sees them, and what the rounds a later view
redid put on the wire.

Each view is audited with its own matrix (the strategy's combine step on its members'
graph); a view ends where the next one starts over, and the rounds it had begun past that
point were sent again under the next view: those are re-releases, which privacy
accounting must count.
"""

from __future__ import annotations

import itertools
from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from privnet.agent import schedule as expand
from privnet.agent.spec import STRATEGY_STEP, Schedule, Strategy
from privnet.orchestrator.audit.playback import view_reach
from privnet.orchestrator.conductor import View
from privnet.orchestrator.experiment import schedules, topology
from privnet.orchestrator.experiment.instance import Instance
from privnet.orchestrator.experiment.specs import view_matrix
from privnet.orchestrator.replay import Replay, SessionWire

PLAIN_REL = 1e-12  # a model within this relative distance of the truth is in the clear
RE_RELEASES = ("same_value", "another_value", "frames", "fresh_masks")


@dataclass(frozen=True)
class Part:
    """One membership view of a session as the audit sees it: the matrix of the strategy's
    combine step on its members' graph (`view_matrix`), the last round of it that stands
    (the next view redid the rest) and the last round of it on the wire."""

    view: View
    A: np.ndarray
    end: int
    reach: int
    schedule: Schedule | None = None  # a time-varying topology's, on the view's members

    @property
    def last(self) -> int:
        return max(self.end, self.reach)

    def at(self, round_: int) -> np.ndarray:
        """The combine step's matrix in round `round_`: A, or the schedule's of that round."""
        return self.A if self.schedule is None else expand.matrix(self.schedule, round_)

    def key(self, round_: int) -> tuple[int, int]:
        """(view, graph): the rounds that share a matrix share a key."""
        return self.view.view, 0 if self.schedule is None else expand.index(self.schedule, round_)


def parts(
    problem: Instance, strategy: Strategy, views: Sequence[View] | None, seen: SessionWire
) -> list[Part]:
    """The session's views, or one view of everyone when its membership never changed."""
    c = problem.config
    index = (0, 1, 2).index(STRATEGY_STEP[strategy])
    made = problem.schedule
    if views is None:
        everyone = View(0, 0, 1, tuple(range(c.agents)), "start")
        timed = None if made is None else schedules.for_view(made, Strategy.ATC)
        return [Part(everyone, problem.matrices(strategy)[index], c.iters, c.iters, timed)]
    reach, found = view_reach(seen), []
    for k, view in enumerate(views):
        end = views[k + 1].start - 1 if k + 1 < len(views) else c.iters
        members = frozenset(view.members)
        if made is not None:
            timed = schedules.for_view(made, Strategy.ATC, members)
            mean = schedules.mean_matrix(timed, view.start, c.iters)
            found.append(Part(view, mean, end, reach.get(view.view, 0), timed))
            continue
        a = problem.A if len(members) == c.agents else view_matrix(problem, members)
        A = topology.strategy_matrices(strategy, a)[index]
        found.append(Part(view, A, end, reach.get(view.view, 0)))
    return found


def senders(A: np.ndarray, hub: int) -> list[int]:
    """The agents whose models reach `hub` in the step with matrix A (itself not included)."""
    return [int(m) for m in np.flatnonzero(A[:, hub]) if m != hub]


def round_messages(A: np.ndarray) -> int:
    """Messages a round of the step with matrix A sends: its off-diagonal weights."""
    return int(np.count_nonzero(A) - A.shape[0])


def redo(parts: Sequence[Part], seen: SessionWire, truth: Replay, step: int) -> dict[str, Any]:
    """What the rounds a later view redid put on the wire, and who learns what from them.

    The round a view starts from re-sends each member's value of the round before: the
    same clear value (unless the member came back from an older model), under the masked
    schemes with a fresh mask (the view is in the masks' HKDF info), under random and ghp
    with the same seeded noise, so the very same vector. Per agent (`re_releases`):
    `same_value` and `another_value` (sent once more, the same value or not), `frames`
    (the frames sending them again) and `fresh_masks` (those unlike every earlier frame on
    the same link)."""
    counts = _re_releases(seen, truth)
    twice = _combined_twice(parts, seen, step)
    fresh = sum(t["fresh_masks"] for t in counts.values())
    again = sum(t["frames"] for t in counts.values())
    return {
        "rounds_redone": [
            {
                "view": nxt.view.view,
                "from_round": nxt.view.start,
                "rounds_begun_before": max(0, part.reach - part.end),
            }
            for part, nxt in itertools.pairwise(parts)
        ],
        "re_releases": {
            s: {k: tally[k] for k in RE_RELEASES} for s, tally in sorted(counts.items())
        },
        "hubs_combining_a_round_twice": dict(sorted(twice.items())),
        "learns": {
            "eavesdropper": (
                f"redone rounds sent {again} frames again, {fresh} under a fresh mask: "
                "one of a same_value re-release is an independent noisy look at a value "
                "it saw before (privacy accounting must count it as another release); a "
                "frame identical to the earlier one adds nothing; under random and ghp an "
                "another_value frame carries the same noise draw as the first sending, so "
                "the two differ by the values' difference; none is in the clear"
            ),
            "hub": (
                "of a round it did not complete, the masked messages that arrived, whose "
                "masks do not cancel: nothing more; of a round complete under two views, "
                "two aggregates, with each view's weights (of the same values in the "
                f"round a view starts from): {sum(twice.values())} hub-rounds"
            ),
        },
    }


def _re_releases(seen: SessionWire, truth: Replay) -> dict[int, Counter[str]]:
    """Per sender, the frames a later view sent again for a round and step already sent."""
    sent: dict[tuple[int, int, int], dict[int, dict[int, np.ndarray]]] = defaultdict(dict)
    for (v, s, r, i, j), vector in seen.views.items():
        sent[(s, i, j)].setdefault(v, {})[r] = vector
    counts: dict[int, Counter[str]] = defaultdict(Counter)
    for (s, i, j), by_view in sent.items():
        first, *later = sorted(by_view)
        for v in later:
            tally = counts[s]
            before, now = truth.views.get((first, s, i, j)), truth.views.get((v, s, i, j))
            same = before is None or now is None or _same(before, now)  # unknown: assume so
            tally["same_value" if same else "another_value"] += 1
            for r, vector in by_view[v].items():
                earlier = [by_view[u][r] for u in by_view if u < v and r in by_view[u]]
                tally["frames"] += 1
                tally["fresh_masks"] += not any(np.array_equal(e, vector) for e in earlier)
    return counts


def _same(a: np.ndarray, b: np.ndarray) -> bool:
    return float(np.linalg.norm(a - b)) <= PLAIN_REL * float(np.linalg.norm(a))


def _combined_twice(parts: Sequence[Part], seen: SessionWire, step: int) -> Counter[int]:
    """Per hub: rounds whose every message reached it under more than one view."""
    views: dict[tuple[int, int], int] = defaultdict(int)
    for part in parts:
        v = part.view.view
        for hub in part.view.members:
            for i in range(part.view.start, part.last + 1):
                sending = senders(part.at(i), hub)
                if sending and all((v, m, hub, i, step) in seen.views for m in sending):
                    views[(hub, i)] += 1
    return Counter(hub for (hub, _), n in views.items() if n > 1)
