"""The experiment a command's flags make: the flags themselves, the configuration they give
(a TOML file or preset with the flags over it) and the output directory."""

from __future__ import annotations

import argparse
import secrets
import time
from pathlib import Path

from privnet.agent.private import private_dir
from privnet.agent.spec import ConfigError, Rekey, WireDtype
from privnet.orchestrator.api import experiment_default
from privnet.orchestrator.engines.options import check_neighbour
from privnet.orchestrator.experiment import config as configuration
from privnet.orchestrator.experiment.config import ExperimentConfig
from privnet.orchestrator.experiment.topology import (
    RULES,
    TIME_VARYING,
    TOPOLOGIES,
    parse_topology,
    written,
)
from privnet.orchestrator.flags import RANDOM_SEED, on_off, seed_or_random
from privnet.orchestrator.report import OUTPUTS
from privnet.orchestrator.terminal import console
from privnet.orchestrator.trackers import Trackers


def topology_name(text: str) -> str:
    """An argparse type: a topology as the config writes it (regular:K with its degree)."""
    try:
        parse_topology(text)
    except ConfigError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text


def experiment_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--config",
        help="a TOML experiment file, or a shipped preset: " + ", ".join(configuration.presets()),
    )
    parser.add_argument(
        "--strategy", dest="strategies", help="consensus|cta|atc|all or a comma list"
    )
    parser.add_argument(
        "--scheme", dest="schemes", help="none|random|ghp|local-ghp|masked-ghp|all or a comma list"
    )
    parser.add_argument("--agents", type=int)
    parser.add_argument("--iters", type=int, help="rounds (iterations)")
    parser.add_argument("--repeats", type=int)
    parser.add_argument("--mu", type=float, help="step size")
    parser.add_argument(
        "--local-steps",
        dest="local_steps",
        type=int,
        metavar="E",
        help="local gradient steps each agent takes a round, each on its own minibatch, "
        "before it combines (default 1, the paper's)",
    )
    parser.add_argument("--sigma-g2", dest="sigma_g2", type=float, help="noise variance sigma_g^2")
    parser.add_argument("--rule", choices=RULES)
    parser.add_argument(
        "--matrix",
        help="a user-given combination matrix (.npy or text); several, comma-separated (or a "
        ".npy of shape (L, P, P)): a schedule, round i using number (i - 1) mod L",
    )
    parser.add_argument(
        "--topology",
        type=topology_name,
        metavar="KIND",
        help=" | ".join(map(written, TOPOLOGIES + TIME_VARYING)),
    )
    parser.add_argument("--radius", type=float, help="random geometric graph radius")
    parser.add_argument("--edges", help="edge-list file for --topology file")
    parser.add_argument("--batch", type=int, help="minibatch size (default: full batch)")
    parser.add_argument("--rekey", choices=[str(r) for r in Rekey])
    parser.add_argument(
        "--seal-links",
        dest="seal_links",
        type=on_off,
        metavar="on|off",
        help="seal every peer frame end to end (default on); off: the paper's visible wire",
    )
    _wire_and_adversary_flags(parser)
    parser.add_argument(
        "--seed",
        type=seed_or_random,
        help="data, graph and noise seed; `random` (or empty): a fresh one (`privnet run`: "
        "secret, kept in the run's secrets.json, 0600)",
    )
    parser.add_argument("--out", type=Path, help="output directory (default runs/<name>-<time>)")
    parser.add_argument(
        "--account",
        action="store_true",
        help="account epsilon(i) per agent from twin runs on D and D' (`privacy` in summary.json)",
    )
    parser.add_argument(
        "--neighbour-agent",
        dest="neighbour",
        type=int,
        default=experiment_default("neighbour"),
        metavar="P",
        help="the agent whose data D' replaces (default 0)",
    )


def _wire_and_adversary_flags(parser: argparse.ArgumentParser) -> None:
    """What the agents send besides the algorithm: attackers, defenses, the wire's form."""
    parser.add_argument(
        "--byzantine",
        metavar="IDS:ATTACK",
        help="Byzantine agents and their attack, e.g. 3,7:sign-flip or 0-2:alie:z=1.5 "
        "(groups ;-separated): sign-flip, large-norm, gaussian, alie, ipm, dissensus, "
        "label-flip; their models are left out of the metrics (reported apart)",
    )
    parser.add_argument(
        "--defense",
        metavar="NAME[:PARAMS]",
        help="what every honest hub runs: none (default); clip (ClippedGossip) or trim "
        "(coordinate-wise trimmed mean) under none/random/ghp; clip-step (bounds the hub's "
        "own step) under every scheme, e.g. clip:b=2, trim:b=1, clip-step:tau=0.1",
    )
    parser.add_argument(
        "--wire-dtype",
        dest="wire_dtype",
        choices=[str(w) for w in WireDtype],
        help="how releases travel: f8 (float64, 8 bytes a parameter) or u4 (integers on the "
        "noise lattice mod 2^32, 4 bytes; docs/tasks/big-models.md); default: the "
        "problem's dtype (float64: f8)",
    )


OVERRIDES = (
    "strategies",
    "schemes",
    "agents",
    "iters",
    "repeats",
    "mu",
    "local_steps",
    "sigma_g2",
    "rule",
    "matrix",
    "topology",
    "radius",
    "edges",
    "batch",
    "rekey",
    "seed",
    "seal_links",
    "byzantine",
    "defense",
    "wire_dtype",
)


def experiment(
    args: argparse.Namespace, base: ExperimentConfig | None = None, drawn: int | None = None
) -> ExperimentConfig:
    """The experiment: `base` (or the --config file) with the flags over it; `--seed random`
    takes `drawn`, or a fresh seed."""
    config = configuration.load(args.config) if args.config else (base or ExperimentConfig())
    flags = {k: getattr(args, k) for k in OVERRIDES}
    if flags["seed"] == RANDOM_SEED:
        flags["seed"] = secrets.randbits(63) if drawn is None else drawn
    config = configuration.with_overrides(config, flags)
    if getattr(args, "account", False) or args.command == "dp-audit":
        check_neighbour(args.neighbour, config.agents)  # the library's words
    return config


PREVIOUS = "previous-"  # where an earlier run's files in a reused --out go


def out_dir(
    args: argparse.Namespace, config: ExperimentConfig, command: str, private: bool = False
) -> Path:
    """The command's directory (`private`: 0700, its files hold secrets). An --out that
    holds an earlier run's files keeps them apart: they move into `previous-<time>/` first
    (anything else there stays where it is)."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    out = args.out or Path("runs") / f"{command}-{config.name}-{stamp}"
    if out.exists() and not out.is_dir():
        raise ConfigError(f"--out {out} is a file: give a directory (made if missing)")
    earlier = [out / name for name in OUTPUTS if (out / name).exists()]
    if earlier:
        previous = out / f"{PREVIOUS}{stamp}"
        previous.mkdir(mode=0o700, exist_ok=True)
        for path in earlier:
            path.rename(previous / path.name)
        console.print(f"{out} held an earlier run: its files are now in {previous}")
    if private:
        return private_dir(out)
    out.mkdir(parents=True, exist_ok=True)
    return out


def trackers(args: argparse.Namespace, out: Path | None) -> Trackers:
    """`--tensorboard DIR`, `--mlflow`, `--mlflow-uri URI`: where the metrics go beside the
    run's files (`check` fails on a missing extra before anything runs)."""
    return Trackers.of(args.tensorboard, args.mlflow, args.mlflow_uri, out)
