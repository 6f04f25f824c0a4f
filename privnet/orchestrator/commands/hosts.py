"""Runs others start or that span hosts: `privnet prepare` (a run's secrets for compose, or
one bundle per host), `privnet site` (one host's part) and `privnet lab` (hosts made of
network namespaces here)."""

from __future__ import annotations

import argparse
from pathlib import Path

from privnet.agent.spec import ConfigError
from privnet.orchestrator.commands.experiment import experiment, experiment_flags, out_dir
from privnet.orchestrator.flags import integer
from privnet.orchestrator.terminal import console

COMPOSE_BROKER = "broker:1883"  # `prepare --broker`: the compose file's broker service
COMPOSE_MOUNT = Path("/privnet")  # `prepare --mount`: where its containers mount --out


def prepare(args: argparse.Namespace, _: None) -> int:
    """Secrets for a compose run: broker users and ACL, the orchestrator's key, agent launches;
    with --hosts, one bundle per host and the core's."""
    from privnet.orchestrator.engines.prepare import prepare as write

    if args.hosts is not None:
        from privnet.orchestrator import sites

        compose = {
            "--broker": args.broker != COMPOSE_BROKER,
            "--mount": args.mount != COMPOSE_MOUNT,
            "--broker-uid": args.broker_uid is not None,
            "--client-uid": args.client_uid is not None,
        }
        if any(compose.values()):
            flags = ", ".join(flag for flag, given in compose.items() if given)
            raise ConfigError(
                f"prepare --hosts: drop {flags} (compose's); the core's address is hosts.toml's"
            )
        hosts = sites.Hosts.load(args.hosts)
        if args.agents is not None:
            hosts.check(args.agents, str(args.hosts))
        sites.prepare_hosts(
            args.out, hosts, args.run_name, tuple(args.hostname) if args.tls else None
        )
        console.print(
            f"wrote run {args.run_name!r} ({hosts.agents} agents) to {args.out}: core/ stays "
            f"here, {', '.join(f'{h}/' for h in hosts.hosts)} go to their hosts"
        )
        return 0
    if args.agents is None:
        raise ConfigError("prepare needs --agents N (or --hosts hosts.toml)")
    write(
        args.out,
        args.agents,
        args.run_name,
        broker=args.broker,
        tls_hostnames=tuple(args.hostname) if args.tls else None,
        mount=args.mount,
        broker_uid=args.broker_uid,
        client_uid=args.client_uid,
        stack=args.stack,
    )
    console.print(
        f"wrote the secrets of run {args.run_name!r} ({args.agents} agents) to {args.out}"
    )
    return 0


def prepare_config(args: argparse.Namespace) -> None:
    """The broker's address and --out, before anything is written."""
    from privnet.agent.access import BrokerAddress

    BrokerAddress.parse(args.broker)
    if args.out.exists() and not args.out.is_dir():
        raise ConfigError(f"--out {args.out} is a file: give a directory (made if missing)")


def site(args: argparse.Namespace, _: None) -> int:
    """One host's part of a run across hosts (`privnet site BUNDLE`)."""
    from privnet.orchestrator.sites import site as serve

    return serve(args.bundle, args.via, args.port, args.out, args.agents_per_process)


def lab(args: argparse.Namespace, _: None) -> int:
    """A run across hosts that are network namespaces on this machine, over WAN-like links."""
    from privnet.orchestrator.lab.netns import Conditions, parse_partitions
    from privnet.orchestrator.lab.run import run_lab, strip_flags

    given = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    given.set_defaults(command="lab")
    experiment_flags(given)
    given.add_argument("--tls", action="store_true")
    given.add_argument("--agents-per-process", type=integer(1), default=1)
    known, _rest = given.parse_known_args(args.forward)
    taken = [a for a in args.forward if a.split("=")[0] in ("--prepared", "--resume")]
    if taken:
        raise ConfigError(f"privnet lab prepares and starts the run itself: drop {taken}")
    config = experiment(known)
    conditions = Conditions.parse(args.delay, args.loss, args.rate)
    partitions = parse_partitions(args.partition or "", args.hosts)
    drop = {"--tls": False, "--agents-per-process": True, "--out": True}
    return run_lab(
        args.hosts,
        conditions,
        partitions,
        config.agents,
        out_dir(known, config, "lab"),
        strip_flags(args.forward, drop),
        tls=known.tls,
        per_process=known.agents_per_process,
    )


def nothing(_: argparse.Namespace) -> None:
    """The command checks its own flags as it runs (`site`, `lab`)."""
