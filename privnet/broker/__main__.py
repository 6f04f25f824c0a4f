"""`python -m privnet.broker`: start a local broker, print its address, stop it on Ctrl-C or
SIGTERM.

`python -m privnet.broker credentials --out DIR --agents N --run NAME` instead writes a run's
credentials for docker-compose (see `write_compose_files`).
"""

import argparse
import signal
import sys
from pathlib import Path

from privnet.broker.credentials import Credentials
from privnet.broker.launcher import KINDS, BrokerKind, launch, write_compose_files


def serve(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m privnet.broker", description=__doc__)
    parser.add_argument(
        "--kind", choices=KINDS, default=BrokerKind.AUTO, help="which broker (auto)"
    )
    parser.add_argument(
        "--credentials",
        type=Path,
        metavar="FILE",
        help="enforce these users and their ACL (credentials.json of `credentials`)",
    )
    parser.add_argument("--tls", action="store_true", help="TLS only, with a per-run CA")
    args = parser.parse_args(argv)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    try:
        creds = Credentials.from_json(args.credentials.read_text()) if args.credentials else None
        with launch(args.kind, credentials=creds, tls=args.tls) as broker:
            ca = f", CA {broker.ca_file}" if broker.ca_file else ""
            print(
                f"{broker.kind} broker listening on {broker.address}{ca} (Ctrl-C stops it)",
                flush=True,
            )
            signal.pause()
    except KeyboardInterrupt:
        pass
    except (ValueError, OSError, RuntimeError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


def credentials(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m privnet.broker credentials",
        description="Write fresh per-run broker credentials, ACL and mosquitto.conf for compose.",
    )
    parser.add_argument("--out", type=Path, required=True, help="directory to write (created)")
    parser.add_argument("--agents", type=int, required=True, help="number of agents")
    parser.add_argument("--run", required=True, help="run name (topic namespace)")
    parser.add_argument("--tls", action="store_true", help="add a per-run CA and server cert")
    parser.add_argument(
        "--hostname", action="append", default=[], help="name clients use for the broker (TLS)"
    )
    parser.add_argument(
        "--mount", type=Path, default=Path("/privnet"), help="where containers mount --out"
    )
    parser.add_argument(
        "--broker-uid",
        type=int,
        help="owner of privnet/broker/ (1883 in eclipse-mosquitto; needs root)",
    )
    parser.add_argument(
        "--client-uid", type=int, help="owner of the clients' files (1000 in privnet's image)"
    )
    args = parser.parse_args(argv)
    try:
        creds = Credentials.generate(args.run, args.agents)
        write_compose_files(
            args.out,
            creds,
            tls_hostnames=tuple(args.hostname) if args.tls else None,
            mount=args.mount,
            broker_uid=args.broker_uid,
            client_uid=args.client_uid,
        )
    except (ValueError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"credentials of run {args.run!r} ({args.agents} agents) written to {args.out}")
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["credentials"]:
        return credentials(argv[1:])
    return serve(argv)


if __name__ == "__main__":
    sys.exit(main())
