"""What the user typed, checked: argument types, a parser whose errors are one line, and the
one place that turns an exception the user caused into a one-line error with its fix.

Everything a user gives (flags, TOML keys, paths) is checked before anything starts, and a
bad value is a `ConfigError` (or argparse's error) saying what is wrong and how to fix it;
`privnet` prints it on one line and exits 2. Tracebacks are for bugs, or `--verbose`.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable
from typing import NoReturn

from privnet.agent.spec import ConfigError

USER_ERROR = 2  # the exit code of a command the user must change
RANDOM_SEED = "random"  # --seed random: a fresh secret seed


class Parser(argparse.ArgumentParser):
    """argparse, its errors on one line (the usage is a `--help` away), exit 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(USER_ERROR, f"{self.prog}: error: {one_line(message)} (see {self.prog} -h)\n")


def one_line(text: str) -> str:
    return " ".join(text.split())


def user_error(exc: BaseException) -> str | None:
    """The one-line message of an error the user caused (a bad setting, a path they gave
    that cannot be used), or None: a bug, whose traceback must be seen."""
    if isinstance(exc, ConfigError):
        return one_line(str(exc))
    if isinstance(exc, OSError) and exc.filename is not None:
        fix = {
            PermissionError: "give a path you may use, or change its permissions",
            FileNotFoundError: "check the path",
            FileExistsError: "give a directory",
            NotADirectoryError: "give a directory",
            IsADirectoryError: "give a file",
        }.get(type(exc), "check the path and the disk")
        return one_line(f"{exc.filename}: {exc.strerror or exc}; {fix}")
    return None


def integer(low: int, high: int | None = None, what: str = "") -> Callable[[str], int]:
    """An argparse type: an integer in [low, high]."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
        if value < low or (high is not None and value > high):
            top = "" if high is None else f" and <= {high}"
            raise argparse.ArgumentTypeError(f"{value}: give an integer >= {low}{top}{what}")
        return value

    return parse


def positive(text: str) -> float:
    """An argparse type: a finite number > 0 (seconds, say)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not (value > 0 and math.isfinite(value)):
        raise argparse.ArgumentTypeError(f"{text}: give a number > 0")
    return value


def comma_list(parse: Callable[[str], object], what: str) -> Callable[[str], str]:
    """An argparse type: a comma list whose every item `parse` accepts (kept as text)."""

    def check(text: str) -> str:
        items = [item.strip() for item in text.split(",")]
        for item in items:
            try:
                parse(item)
            except (ValueError, argparse.ArgumentTypeError) as exc:
                raise argparse.ArgumentTypeError(f"{item!r} in {text!r}: {what} ({exc})") from None
        return ",".join(items)

    return check


def on_off(text: str) -> bool:
    """An argparse type: on or off (yes/no, true/false)."""
    if text.lower() in ("on", "yes", "true"):
        return True
    if text.lower() in ("off", "no", "false"):
        return False
    raise argparse.ArgumentTypeError(f"{text!r}: give on or off")


def seed_or_random(text: str) -> int | str:
    """An argparse type: a seed in [0, 2^63), or RANDOM_SEED (`random`, or empty)."""
    if text.strip().lower() in ("", RANDOM_SEED):
        return RANDOM_SEED
    try:
        seed = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: give an integer, or `random`") from None
    if not 0 <= seed < 2**63:
        raise argparse.ArgumentTypeError(f"{seed}: give an integer in [0, 2^63), or `random`")
    return seed


def yes_no(text: str) -> bool:
    """An argparse type: yes or no (true/false, 1/0), as docker-compose's env gives it."""
    answers = {"yes": True, "true": True, "1": True, "no": False, "false": False, "0": False}
    try:
        return answers[text.strip().lower()]
    except KeyError:
        raise argparse.ArgumentTypeError(f"{text!r}: say yes or no") from None


def port(text: str) -> int:
    """An argparse type: a TCP port (0: any free one)."""
    try:
        port = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: give a TCP port, 0-65535") from None
    if not 0 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"{port}: give a TCP port, 0-65535 (0: any free one)")
    return port


def agent_ids(text: str) -> tuple[int, ...]:
    """An argparse type: agent ids, a comma list."""
    try:
        return tuple(int(m) for m in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: give agent ids, e.g. 3,7") from None


def one_of(choices: tuple[str, ...]) -> Callable[[str], str]:
    """A `comma_list` item: one of `choices`."""

    def check(name: str) -> str:
        if name not in choices:
            raise ValueError(f"choose from {', '.join(choices)}")
        return name

    return check
