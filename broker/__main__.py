"""`python -m broker`: start a local broker, print its address, stop it on Ctrl-C or SIGTERM."""

import argparse
import signal
import sys

from broker.launcher import KINDS, acl_file, launch


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m broker", description=__doc__)
    parser.add_argument("--kind", choices=KINDS, default="auto", help="which broker (auto)")
    parser.add_argument("--acl-run", metavar="RUN", help="enforce the ACL of this run (mosquitto)")
    parser.add_argument("--agents", type=int, default=30, help="agents in the ACL (30)")
    args = parser.parse_args(argv)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    try:
        acl = acl_file(args.agents, args.acl_run) if args.acl_run else None
        with launch(args.kind, acl=acl) as broker:
            print(
                f"{broker.kind} broker listening on {broker.address} (Ctrl-C stops it)", flush=True
            )
            signal.pause()
    except KeyboardInterrupt:
        pass
    except (ValueError, FileNotFoundError, RuntimeError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
