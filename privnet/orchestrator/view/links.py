"""Model bytes per round on each link of a membership view: what its members' frames weigh.

The orchestrator does not see the peer plane (it reads only its own topics), and the view
adds nothing to the wire to see it: a link's bytes per round are the sizes of the Model
frames its two ends send each other per round (one per communicating step and direction),
as the agents' own codec builds them (sealed, or MACed) and MQTT frames them. The agents'
exact counts come with each session's Finished frames.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

from privnet.agent import topics
from privnet.agent.links import Links
from privnet.agent.messages import Model
from privnet.agent.protocol import PEER_QOS
from privnet.agent.spec import AgentSpec

LINK_KEY = bytes(32)  # any key: a seal or a MAC is as long under every key


def link_bytes(
    run: str,
    specs: Iterable[AgentSpec],
    members: Iterable[int],
    start: int,
    view: int,
    sealed: bool = True,
) -> dict[tuple[int, int], float]:
    """(low, high) agent pair -> Model bytes per round on that link, both directions, under
    the view numbered `view` that starts at round `start`; `sealed`: as the run seals its
    peer frames (`--seal-links`), through the agents' own codec (`privnet.agent.links.Links`)."""
    inside = frozenset(members)
    sent: dict[tuple[int, int], float] = {}
    for spec in specs:
        if spec.agent not in inside:
            continue
        w = np.zeros(spec.dim, dtype=spec.wire.code)  # float64, or u4 lattice words
        receivers = sorted({k for step in spec.steps for k in step.receivers(spec.agent)})
        keys = dict.fromkeys(receivers, LINK_KEY)
        links = Links(run, spec.agent, spec.dim, view, keys, sealed=sealed, dtype=spec.wire.code)
        for step in spec.steps:
            for k in step.receivers(spec.agent):
                model = Model(spec.agent, k, start, step.step, w, view)
                topic = topics.peer_topic(run, k, spec.agent)
                edge = (min(spec.agent, k), max(spec.agent, k))
                sent[edge] = sent.get(edge, 0.0) + sum(
                    topics.mqtt_publish_size(topic, len(frame), PEER_QOS)
                    for frame in links.frames(model)
                )
    return sent
