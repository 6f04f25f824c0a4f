"""The agent's protocol as a pure state machine (sans-IO, like h11).

`receive` a message, get the messages to send: no sockets, clocks or event loops, so every
engine runs the very same code and the protocol is tested without a broker. A round runs the
paper's three combine steps in order j = 1, 0, 2 (eqs. privPreComb, privUpdate, privPostComb);
a communicating step sends one message per out-neighbour, waits for one per in-neighbour and
combines sum_m a_mp * (message from m), its own term included (the masked schemes take each
term on the noise grid, where their masks cancel exactly)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping

import numpy as np

from privnet.agent import defenses, keys, lattice, rng, schedule
from privnet.agent.byzantine import Attacker
from privnet.agent.losses import Loss
from privnet.agent.messages import KeyPlan, KeyShare, Message, Model, Reason, Rejected, Report
from privnet.agent.protocol import Counters
from privnet.agent.schemes.base import Source
from privnet.agent.seats import Seat, StepMasks, round_masks, split_senders, union_seats
from privnet.agent.spec import STEPS, AgentSpec, Rekey, StepPlan, WireDtype
from privnet.agent.wire.model import all_finite

Position = tuple[int, int]  # (round, index of the step in STEPS)


class AgentCore:
    """One node of the graph. See the module docstring for the round structure."""

    def __init__(
        self,
        spec: AgentSpec,
        loss: Loss,
        identity: keys.Identity | None = None,
        directory: Mapping[int, keys.PublicIdentity] | None = None,
    ) -> None:
        if loss.dim != spec.dim:
            raise ValueError(f"loss has dim {loss.dim}, the spec says {spec.dim}")
        if spec.scheme.masked and (identity is None or directory is None):
            raise ValueError(f"{spec.scheme} needs the agent's identity and its neighbours' keys")
        self.spec, self.loss = spec, loss
        self.scheme_part = spec.scheme.part  # what the releases add and what must be agreed
        self.me = spec.agent
        self.identity = identity
        self.directory = dict(directory or {})
        self.w = np.array(spec.w0, dtype=np.float64) if spec.w0 else np.zeros(spec.dim)
        self.round, self.stage = spec.start, 0
        self.until = spec.rounds  # the last round to run before holding (Go's `until`)
        self.value = self.w.copy()  # what the current step combines (w, phi or psi)
        self.counters = Counters()
        self.started, self._prepared, self._sent = False, False, False
        self._inbox: dict[Position, dict[int, np.ndarray]] = {}
        # masked schemes' state: seats[(hub, step)], ephemeral keys, partners' keys per epoch
        self._seats: dict[tuple[int, int], Seat] = {}
        self._ephemeral: dict[int, keys.Ephemeral] = {}
        self._shared_sent: set[int] = set()
        self._partner_keys: dict[tuple[int, int, int, int], bytes] = {}  # (epoch, hub, step, m)
        # "Keys still to come" in O(1): keys held per (epoch, step), partners per step.
        self._keys_held: Counter[tuple[int, int]] = Counter()
        self._partners: Counter[int] = Counter()
        self._secrets: dict[tuple[int, int, bytes], bytes] = {}  # (epoch, m, public) -> secret
        self._banks: dict[tuple[int, int], StepMasks] = {}  # (epoch, step)
        self._weights_in: dict[int, np.ndarray] = {}  # step -> its a_mp as a column
        self._grid = lattice.grid(spec.sigma_g, spec.wire)  # the lattice releases sit on
        self._u4 = spec.wire is WireDtype.U4  # releases travel as lattice words (lattice.py)
        self._relayed: set[tuple[int, int, int, int]] = set()  # (owner, partner, step, epoch)
        self._round_plans: dict[int, schedule.Plans] = {}  # a schedule's: this round, next
        self._streams: dict[tuple[int, int, int, int], keys.PairStream] = {}  # a schedule's
        self.defense = defenses.Combiner(defenses.parse(spec.defense, spec.scheme), self.me)
        self.attacker = Attacker.of(spec)

    # ---- public API -------------------------------------------------------------------

    @property
    def done(self) -> bool:
        return self.round > self.spec.rounds

    @property
    def held(self) -> bool:
        """Rounds through `until` are done: wait for the next view (or the end)."""
        return self.round > self.until

    @property
    def position(self) -> Position:
        return (self.round, self.stage)

    @property
    def keyed(self) -> bool:
        """Whether round 1 can run without waiting for any key (always, but when masked)."""
        return not self.scheme_part.masked or all(
            self._keys_ready(plan) for plan in self.spec.steps if plan.communicates
        )

    def prepare(self) -> list[Message]:
        """Before the rounds: masked schemes' hubs announce their splits, agents share keys."""
        if not self.scheme_part.masked or self._prepared:
            return []
        self._prepared = True
        return self._announce_seats() + self._share_keys()

    def resume_from(self, w: np.ndarray) -> None:
        """Start from `w` (the agent's model after round start - 1) instead of spec.w0."""
        if w.shape != (self.spec.dim,):
            raise ValueError(f"model of shape {w.shape}, expected ({self.spec.dim},)")
        self.w, self.value = w.copy(), w.copy()

    def start(self, until: int | None = None) -> list[Message]:
        """Run from the start round through `until` (preparing first if nobody did)."""
        out = self.prepare()
        self.started = True
        self.until = self.spec.rounds if until is None else min(until, self.spec.rounds)
        return out + self._advance()

    def extend(self, until: int) -> list[Message]:
        """Run on through a later `until` (the orchestrator paces the view)."""
        self.until = max(self.until, min(until, self.spec.rounds))
        return self._advance()

    def receive(self, msg: Message) -> list[Message]:
        """Consume one message; raises Rejected for anything out of protocol (the node counts).

        keys.BadKey (a key share whose signature fails) is raised as is; the caller counts
        it. Nothing was stored, so the genuine share still completes the pair.
        Before `start`, models are kept for round 1 and key shares answered, nothing more.
        """
        if isinstance(msg, Model):
            self._accept_model(msg)
        elif isinstance(msg, KeyPlan):
            self._accept_plan(msg)
        elif isinstance(msg, KeyShare):
            relay = self._accept_share(msg)
            if relay is not None:
                return [relay]
        else:
            raise Rejected(Reason.SCHEMA, f"agents do not accept {type(msg).__name__} messages")
        if self.started:
            return self._advance()
        out = self._share_keys()
        if self.scheme_part.masked and self.keyed:
            self._open_banks()
        return out

    def waiting_for(self) -> list[int]:
        """Who this agent is blocked on (for a clear error when a neighbour goes silent)."""
        if self.done or self.held:
            return []
        if not self.started:  # before round 1, only key shares can be missing (masked)
            plans = [p for p in self.spec.steps if p.communicates]
            if not self.scheme_part.masked or not plans:
                return []
            return sorted(set().union(*(self._missing_keys(p) for p in plans)))
        plan = self._plans(self.round)[self.stage]
        if self.scheme_part.masked and not self._keys_ready(plan):
            return sorted(self._missing_keys(plan))
        have = self._inbox.get(self.position, {})
        return [m for m in plan.senders(self.me) if m not in have]

    # ---- the round -------------------------------------------------------------------

    def _advance(self) -> list[Message]:
        out: list[Message] = []
        while not self.held:
            plan = self._plans(self.round)[self.stage]
            if plan.communicates:
                if not self._sent:
                    if self.scheme_part.masked:
                        out += self._share_keys()
                        if not self._keys_ready(plan):
                            break
                    out += self._send(plan)
                    self._sent = True
                inbox = self._inbox.get(self.position, {})
                if len(inbox) < len(plan.weights_in):
                    break
                combined = self._combine(plan, inbox)
                del self._inbox[self.position]
            else:
                combined = self.value
            out += self._finish_step(plan, combined)
        return out

    def _finish_step(self, plan: StepPlan, combined: np.ndarray) -> list[Message]:
        if plan.step == 0:  # into mu * g's own fresh buffer: a model-sized array less
            combined = np.subtract(combined, (d := self.spec.mu * self._descent()), out=d)
        self.value = combined
        self._sent = False
        if self.stage < len(STEPS) - 1:
            self.stage += 1
            return []
        self.w = self.value  # no step changes a value in place: report and history share it
        report = Report(sender=self.me, round=self.round, w=self.w)
        self.round, self.stage = self.round + 1, 0
        self._forget_epoch(self.round - 1)
        return [report]

    def _descent(self) -> np.ndarray:
        """The sum of E local gradients (`--local-steps E`, the oracle sums alike): x_0 = the
        value, x_{e+1} = x_e - mu g_e, g_e on the round's minibatch e; psi = C0(phi) - mu
        sum_e g_e (ATC, CTA: x_E). E = 1: the paper's one gradient."""
        g = self.loss.grad(self.value, self.round)
        if self.spec.local_steps == 1:
            return g
        total, x = g.copy(), self.value
        for local in range(1, self.spec.local_steps):
            x = x - self.spec.mu * g
            g = self.loss.grad(x, self.round, local)
            total += g
        return total

    def _send(self, plan: StepPlan) -> list[Message]:
        """Privatize the current value for every out-neighbour; keep the self-term."""
        vectors = self._privatize(plan)
        own = vectors[self.me]  # a row of every target's: kept alone, the rest can go once sent
        self._inbox.setdefault(self.position, {})[self.me] = own if own.base is None else own.copy()
        return [
            Model(self.me, k, self.round, plan.step, v, self.spec.view)
            for k, v in vectors.items()
            if k != self.me
        ]

    def _privatize(self, plan: StepPlan) -> dict[int, np.ndarray]:
        """What goes to every out-neighbour (and the self-term): the scheme's release, then,
        for a masked scheme, the pair masks on the lattice (rng.masked_release)."""
        released = self._release(plan)
        if not self.scheme_part.masked:
            if self._u4:  # on the wire as words; the self-term stays as it is
                return lattice.sent(released, self.me, self._grid, self._where(plan))
            return released
        masks, rows = self._masks(plan)
        if self.scheme_part.broadcast and self.attacker is None:  # x itself to all: mask it once
            vectors = self.value
        else:  # np.array: np.stack costs several times more at this size
            vectors = np.array([released[k] for k in masks.targets])
        if self._u4:
            where = self._where(plan)  # into the bank's fresh rows: no second array
            sent = lattice.masked_words(vectors, rows, masks.weights, self._grid, where, rows)
        else:
            sent = rng.masked_release(vectors, rows, masks.weights, self._grid)
        return dict(zip(masks.targets, sent, strict=True))

    def _release(self, plan: StepPlan) -> dict[int, np.ndarray]:
        """The scheme's release of the current value to every target, before any mask
        (privnet.agent.schemes), or a Byzantine agent's."""
        if self.attacker is not None:
            return self.attacker.release(plan, self.value, self.round)
        spec = self.spec
        source = Source(spec.noise_key, plan.step, self.round, spec.agents, spec.dim,
            spec.sigma_g, self._grid, self._u4)  # fmt: skip
        return self.scheme_part.release(self.value, plan.weights_out, self.me, source)

    def _combine(self, plan: StepPlan, inbox: Mapping[int, np.ndarray]) -> np.ndarray:
        """sum_m a_mp (what m sent); masked schemes on the lattice, where masks cancel."""
        if not self.scheme_part.masked and self._u4:  # words back to floats (the
            inbox = lattice.floats(inbox, self._grid)  # self-term is floats already)
        if self.defense.sees_messages:  # issue 34: clip or trim each neighbour's message
            total = self.defense.combine(plan.weights_in, inbox, self.value, plan.step)
        elif not self.scheme_part.masked:
            total = defenses.weighted_sum(plan.weights_in, inbox)
        elif self._u4:  # the words added mod 2^32: the masks cancel, exactly
            terms = [inbox[m] for m in plan.weights_in]
            total = lattice.total(terms, self._grid, f"{self._where(plan)}: the hub's total")
        else:
            a = self._weights_in.get(plan.step)
            if a is None or self.spec.schedule is not None:  # a schedule's weights change
                a = self._weights_in[plan.step] = np.array([*plan.weights_in.values()])[:, None]
            stacked = np.array([inbox[m] for m in plan.weights_in])
            total = rng.on_lattice(stacked, a, self._grid).sum(axis=0)
        if self.attacker is not None:
            self.attacker.saw(plan, inbox, total)
        return self.defense.bound(total, self.value, plan.step)

    def _where(self, plan: StepPlan) -> str:
        return f"agent {self.me}, round {self.round} step {plan.step}"

    # ---- masked schemes: seats, key shares, masks -----------------------------------------

    def _epoch(self, round_: int) -> int:
        return round_ if self.spec.rekey is Rekey.EVERY_ROUND else 0

    def _announce_seats(self) -> list[Message]:
        out: list[Message] = []
        for plan in self.spec.steps:
            senders = plan.senders(self.me)
            if not senders:
                continue
            for m, seat in self._hub_seats(senders).items():
                if m == self.me:
                    self._seat(self.me, plan.step, seat)
                else:
                    out.append(
                        KeyPlan(
                            sender=self.me,
                            receiver=m,
                            step=plan.step,
                            side=seat.side,
                            partners=seat.partners,
                            view=self.spec.view,
                        )
                    )
        return out

    def _accept_plan(self, msg: KeyPlan) -> None:
        self._check_receiver(msg.receiver)
        plan = self._plan_of(msg.step)
        if msg.sender not in plan.receivers(self.me):
            raise Rejected(
                Reason.NOT_NEIGHBOUR,
                f"agent {msg.sender} is not a hub I send to at step {msg.step}",
            )
        if (msg.sender, msg.step) in self._seats:
            raise Rejected(Reason.DUPLICATE, f"second key plan from hub {msg.sender}")
        if msg.side not in (1, -1) or not msg.partners or self.me in msg.partners:
            raise Rejected(
                Reason.SCHEMA,
                f"key plan from hub {msg.sender} has side {msg.side} and partners {msg.partners}",
            )
        self._seat(msg.sender, msg.step, Seat(msg.side, tuple(msg.partners)))

    def _seat(self, hub: int, step: int, seat: Seat) -> None:
        self._seats[(hub, step)] = seat
        self._partners[step] += len(seat.partners)

    def _my_seats(self, step: int) -> dict[int, Seat]:
        return {hub: seat for (hub, j), seat in self._seats.items() if j == step}

    def _share_keys(self) -> list[Message]:
        """Send this epoch's signed ephemeral key to every partner, via the hub."""
        epoch = self._epoch(self.round)
        if not self.scheme_part.masked or epoch in self._shared_sent:
            return []
        needed = {(k, p.step) for p in self.spec.steps for k in p.receivers(self.me)}
        if not needed <= self._seats.keys():
            return []  # already sent, or still waiting for a hub's plan
        assert self.identity is not None
        eph = self._ephemeral.setdefault(epoch, keys.Ephemeral.generate())
        out: list[Message] = []
        for (hub, step), seat in sorted(self._seats.items()):
            for m in seat.partners:
                sig = keys.sign_share(
                    self.identity, self.spec.session, self.me, hub, m, step, epoch, eph
                )
                out.append(
                    KeyShare(
                        sender=self.me,
                        receiver=hub if hub != self.me else m,
                        owner=self.me,
                        hub=hub,
                        partner=m,
                        step=step,
                        epoch=epoch,
                        public=eph.public,
                        signature=sig,
                        view=self.spec.view,
                    )
                )
        self._shared_sent.add(epoch)
        return out

    def _accept_share(self, msg: KeyShare) -> KeyShare | None:
        self._check_receiver(msg.receiver)
        epoch_now = self._epoch(self.round)
        if msg.epoch < epoch_now:
            raise Rejected(Reason.STALE, f"key share for epoch {msg.epoch}, now at {epoch_now}")
        if msg.epoch > epoch_now + 1:
            raise Rejected(Reason.AHEAD, f"key share for epoch {msg.epoch}, now at {epoch_now}")
        if msg.partner != self.me:
            return self._relay(msg)
        seat = self._seats.get((msg.hub, msg.step))
        if seat is None or msg.owner not in seat.partners:
            raise Rejected(
                Reason.NOT_NEIGHBOUR, f"agent {msg.owner} is not my partner at hub {msg.hub}"
            )
        if msg.sender != msg.hub and not (msg.hub == self.me and msg.sender == msg.owner):
            raise Rejected(
                Reason.SPOOFED,
                f"key share of {msg.owner} came from {msg.sender}, not hub {msg.hub}",
            )
        slot = (msg.epoch, msg.hub, msg.step, msg.owner)
        if slot in self._partner_keys:
            raise Rejected(Reason.DUPLICATE, f"second key share of {msg.owner} at hub {msg.hub}")
        owner = self.directory.get(msg.owner)
        if owner is None:
            raise Rejected(Reason.UNKNOWN_SENDER, f"no identity key for agent {msg.owner}")
        keys.verify_share(owner, msg, self.spec.session)
        self._partner_keys[slot] = msg.public
        self._keys_held[(msg.epoch, msg.step)] += 1
        return None

    def _relay(self, msg: KeyShare) -> KeyShare:
        """As hub: forward a share to its partner; both must sit at my hub, on opposite sides."""
        if msg.hub != self.me or msg.sender != msg.owner:
            raise Rejected(
                Reason.NOT_NEIGHBOUR,
                f"key share from {msg.sender} for {msg.partner} "
                f"names hub {msg.hub}; I relay only my own neighbours' shares",
            )
        senders = self._plan_of(msg.step).senders(self.me)
        seats = self._hub_seats(senders) if senders else {}
        if msg.owner not in seats or msg.partner not in seats[msg.owner].partners:
            raise Rejected(
                Reason.NOT_NEIGHBOUR,
                f"agents {msg.owner} and {msg.partner} are not paired at hub {self.me}",
            )
        relayed = (msg.owner, msg.partner, msg.step, msg.epoch)
        if relayed in self._relayed:
            raise Rejected(Reason.DUPLICATE, f"key share of {msg.owner} for {msg.partner} again")
        self._relayed.add(relayed)
        self.counters.relayed += 1
        return KeyShare(
            sender=self.me,
            receiver=msg.partner,
            owner=msg.owner,
            hub=msg.hub,
            partner=msg.partner,
            step=msg.step,
            epoch=msg.epoch,
            public=msg.public,
            signature=msg.signature,
            view=msg.view,
        )

    def _missing_keys(self, plan: StepPlan) -> set[int]:
        epoch = self._epoch(self.round)
        missing = {k for k in plan.receivers(self.me) if (k, plan.step) not in self._seats}
        for hub, seat in self._my_seats(plan.step).items():
            missing |= {
                m for m in seat.partners if (epoch, hub, plan.step, m) not in self._partner_keys
            }
        return missing

    def _keys_ready(self, plan: StepPlan) -> bool:
        epoch = self._epoch(self.round)
        if (epoch, plan.step) in self._banks:
            return True  # built from this epoch's keys, which stay until the epoch ends
        if self._keys_held[(epoch, plan.step)] < self._partners[plan.step]:
            return False  # a partner's key is still to come: no need to find whose
        return not self._missing_keys(plan)

    def _masks(self, plan: StepPlan) -> tuple[StepMasks, np.ndarray]:
        """Per target k (the self-term included): sum over my partners at hub k of
        side * g_pair, on the grid, which cancels at the hub once each term is on the
        lattice. My own term at a hub with 2+ other neighbours has no seat, no mask.

        The pairs' masks come from one keys.PairStream per (pair, hub, step, epoch), read a
        round at a time (see there why that is as safe as a fresh key per round), through a
        keys.MaskBank that maps and combines them for several rounds of the epoch at once.
        """
        epoch, step = self._epoch(self.round), plan.step
        if self.spec.schedule is not None:  # this round's masks, at this round's hubs
            graph, spec = schedule.graph(self.spec.schedule, self.round), self.spec
            targets, weights, rows = round_masks(graph, plan, self.me, self.round, spec.dim,
                spec.sigma_g, lambda hub, m: self._stream(epoch, hub, step, m))  # fmt: skip
            return StepMasks(targets, weights, None), rows
        bank = self._banks.get((epoch, step))
        if bank is None:
            bank = self._banks[(epoch, step)] = self._bank(epoch, plan)
        last = self.round if self.spec.rekey is Rekey.EVERY_ROUND else self.until
        assert bank.bank is not None  # a static spec's: made above
        return bank, bank.bank.at(self.round, last)

    def _open_banks(self) -> None:
        """With every key of the first epoch in: agree on every pair's secret and open its
        stream now, while keying (Go waits for every agent's Ready), not in round 1, which
        would otherwise cost a thousand-agent network (about 140 pairs an agent) several
        rounds' time. The banks are the ones round 1 would build: the same masks."""
        epoch = self._epoch(self.round)
        for plan in self.spec.steps if self.spec.schedule is None else ():
            if plan.communicates and (epoch, plan.step) not in self._banks:
                self._banks[(epoch, plan.step)] = self._bank(epoch, plan)

    def _bank(self, epoch: int, plan: StepPlan) -> StepMasks:
        """Every target, its public weight, and the bank of its masks for this epoch."""
        step = plan.step
        targets = list(plan.weights_out)
        seats = [self._seats.get((hub, step)) for hub in targets]
        pairs = [
            (hub, m)
            for hub, seat in zip(targets, seats, strict=True)
            if seat
            for m in seat.partners
        ]
        streams = [
            keys.PairStream(
                self._secret(epoch, m, self._partner_keys[(epoch, hub, step, m)]),
                self.spec.session,
                hub,
                (self.me, m),
                step,
                epoch,
                self.spec.dim,
                4 if self._u4 else 8,
            )
            for hub, m in pairs
        ]
        coeffs = np.zeros((len(targets), len(pairs)))
        for row, (hub, seat) in enumerate(zip(targets, seats, strict=True)):
            for col, (at, _) in enumerate(pairs):
                if seat is not None and at == hub:
                    coeffs[row, col] = seat.side
        bank = keys.mask_bank(streams, coeffs, self.spec.dim, self.spec.sigma_g, self._u4)
        weights = np.array([plan.weights_out[k] for k in targets])[:, None]
        return StepMasks(targets, weights, bank)

    def _secret(self, epoch: int, partner: int, public: bytes) -> bytes:
        slot = (epoch, partner, public)
        if slot not in self._secrets:
            self._secrets[slot] = self._ephemeral[epoch].agree(public)
            self.counters.agreements += 1
        return self._secrets[slot]

    def _forget_epoch(self, finished_round: int) -> None:
        """With every-round re-keying, drop the finished round's keys (forward secrecy)."""
        if self.spec.rekey is not Rekey.EVERY_ROUND:
            return
        self._ephemeral.pop(finished_round, None)
        self._partner_keys = {s: v for s, v in self._partner_keys.items() if s[0] != finished_round}
        for slot in [s for s in self._keys_held if s[0] == finished_round]:
            del self._keys_held[slot]
        self._secrets = {s: v for s, v in self._secrets.items() if s[0] != finished_round}
        self._banks = {s: v for s, v in self._banks.items() if s[0] != finished_round}
        self._relayed = {r for r in self._relayed if r[3] > finished_round}
        self._streams = {s: v for s, v in self._streams.items() if s[0] != finished_round}

    def _plans(self, round_: int) -> tuple[StepPlan, ...]:
        """A round's plans: the spec's, or under a time-varying topology its schedule's."""
        if self.spec.schedule is None:
            return self.spec.steps
        if round_ not in self._round_plans:
            plans = schedule.plans(self.spec.schedule, round_, self.me)
            if not self.round <= round_ <= self.round + 1:
                return plans  # another round's frame: checked, not kept
            self._round_plans = {r: p for r, p in self._round_plans.items() if r >= self.round}
            self._round_plans[round_] = plans
        return self._round_plans[round_]

    def _hub_seats(self, senders: list[int]) -> dict[int, Seat]:
        """My seats as a hub, keyed once per view (under a schedule: seats.union_seats)."""
        if (made := self.spec.schedule) is None:
            return split_senders(senders, self.me)
        return union_seats(made, self.me, 1, self.spec.rounds)

    def _stream(self, epoch: int, hub: int, step: int, m: int) -> keys.PairStream:
        slot, spec = (epoch, hub, step, m), self.spec
        if slot not in self._streams:
            secret, pair = self._secret(epoch, m, self._partner_keys[slot]), (self.me, m)
            stream = keys.PairStream(secret, spec.session, hub, pair, step, epoch, spec.dim)
            self._streams[slot] = stream
        return self._streams[slot]

    # ---- checks ------------------------------------------------------------------------

    def _check_receiver(self, receiver: int) -> None:
        if receiver != self.me:
            raise Rejected(
                Reason.WRONG_RECEIVER, f"message for agent {receiver} delivered to {self.me}"
            )

    def _plan_of(self, step: int) -> StepPlan:
        if step not in STEPS:
            raise Rejected(Reason.SCHEMA, f"step {step} is not one of {STEPS}")
        return self.spec.plan(step)

    def _accept_model(self, msg: Model) -> None:
        self._check_receiver(msg.receiver)
        plan = self._plan_of(msg.step)
        if self.spec.schedule is not None:  # the plan of the frame's own round
            plan = self._plans(msg.round)[STEPS.index(msg.step)]
        if msg.sender == self.me or msg.sender not in plan.weights_in:  # plan.senders(me)
            raise Rejected(
                Reason.NOT_NEIGHBOUR,
                f"agent {msg.sender} is not an in-neighbour at step {msg.step}"
                + ("" if self.spec.schedule is None else f" in round {msg.round}'s graph"),
            )
        at = (msg.round, STEPS.index(msg.step))
        if at < self.position:
            raise Rejected(
                Reason.STALE,
                f"model for round {msg.round} step {msg.step}; I am at round "
                f"{self.round} step {STEPS[self.stage]}",
            )
        # a schedule's peer may be rounds ahead (it met others since): held up to the run's end
        if msg.round > (self.round + 1 if self.spec.schedule is None else self.spec.rounds):
            raise Rejected(Reason.AHEAD, f"model for round {msg.round}, I am at round {self.round}")
        vector = lattice.received(msg.vector, self.spec.wire, f"model from {msg.sender}")
        if vector.shape != (self.spec.dim,):
            raise Rejected(
                Reason.SHAPE, f"model of shape {vector.shape}, expected ({self.spec.dim},)"
            )
        if not self._u4 and not all_finite(vector):  # np.all costs ~3 us a frame here
            raise Rejected(Reason.NON_FINITE, f"model from {msg.sender} has NaN or inf")
        slot = self._inbox.setdefault(at, {})
        if msg.sender in slot:
            raise Rejected(
                Reason.DUPLICATE,
                f"second model from {msg.sender} for round {msg.round} step {msg.step}",
            )
        slot[msg.sender] = vector
