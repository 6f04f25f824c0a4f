"""The Setup of every member of a view: its spec for the view, its problem, the identities
it may meet and the run's terms, sealed to the identity it registered."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace

from privnet.agent import control, keys, wire
from privnet.agent.protocol import setup_context
from privnet.agent.spec import AgentSpec
from privnet.orchestrator.conductor.records import SessionPlan, View, view_session


@dataclass(frozen=True)
class Terms:
    """What every agent's Config carries besides its spec and problem."""

    deadline: float
    telemetry: bool
    checkpoint_every: int
    seal_links: bool
    escrow: bool
    models_every: int = 1
    models_f4: bool = False  # Config.models_f4: a float32 problem's Parts as float32


def setups(
    run: str,
    session: int,
    plan: SessionPlan,
    view: View,
    specs: list[AgentSpec],
    identities: Mapping[int, keys.PublicIdentity],
    terms: Terms,
) -> list[control.Setup]:
    """One Setup per spec, in the order of `specs`."""
    known = {m: identity.to_bytes() for m, identity in identities.items()}
    near = {spec.agent: spec.neighbours for spec in specs}
    out = []
    for spec in specs:
        spec = replace(
            spec, view=view.view, start=view.start, session=view_session(spec.session, view.view)
        )
        # Whom this agent may meet: its neighbours (link keys) and theirs (mask pair
        # partners, whose signed key shares it verifies); not the whole network, which
        # would make every Setup, and the link keys agreed, grow with P.
        mine = near[spec.agent]
        reach = {spec.agent, *mine}.union(*(near[k] for k in mine))
        config = control.Config(
            spec,
            plan.problems[spec.agent],
            {m: known[m] for m in sorted(reach)},
            terms.deadline,
            terms.telemetry,
            view.resume.get(spec.agent, view.start - 1),
            terms.checkpoint_every,
            terms.seal_links,
            terms.escrow,
            terms.models_every,
            terms.models_f4,
        )
        sealed = keys.seal(
            identities[spec.agent].static,
            wire.encode_config(config),
            setup_context(run, spec.agent, session, view.view),
        )
        out.append(control.Setup(spec.agent, session, view.view, sealed))
    return out
