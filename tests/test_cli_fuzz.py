"""A fuzz over `privnet`'s flags and TOML keys: no input a user can type gives a traceback.

Every invocation is generated from the parser itself (every subcommand, every flag, values
from its choices or from a mix of plausible and hostile text), with a random TOML file
behind `--config`. Each goes through the pure layer (`cli.configure`: parse, load the TOML,
check every setting) and, where that passes, builds the experiment's `Instance` (graph,
weights, data) as every engine would first; nothing is launched. An error must be one the
user caused, on one line; one that fails there also goes through `cli.main`, which must
exit 2 having printed exactly one line.

In the suite it runs a small, fast number of examples; the big number is the same code as
a script: `python tests/test_cli_fuzz.py --examples 2000` prints its tally.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import math
import os
import sys
import tempfile
import traceback
from collections import Counter
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from privnet.orchestrator import cli
from privnet.orchestrator.experiment.config import ExperimentConfig
from privnet.orchestrator.experiment.instance import Instance
from privnet.orchestrator.flags import user_error

SUITE_EXAMPLES = 60
BUILD_LIMIT = 50 * 2**20  # bytes: configs above this are checked, not built (time)
PATHS = ("missing", "afile", "adir", "exp.toml", "junk.toml", "full")  # in the fuzz's cwd
SETTINGS = [name for name in ExperimentConfig.__dataclass_fields__ if name != "extra"]
OUTCOMES: Counter[str] = Counter()


def _fixtures(where: Path) -> None:
    """The paths path-valued flags take: missing, a file, a dir, TOML, a non-empty dir."""
    (where / "afile").write_text("0 1\n1 2\n")
    (where / "adir").mkdir(exist_ok=True)
    (where / "junk.toml").write_text("agents = = 3\n[[")
    (where / "full").mkdir(exist_ok=True)
    (where / "full" / "notes.txt").write_text("mine\n")


hostile = st.sampled_from(
    ["", "-1", "0", "1", "2", "3", "nan", "inf", "-inf", "1e309", "1e-320", "x", "all",
     "none,none", ",", "10.255.255.1:1883", "foo:bar", "[::1]:0", "9" * 30, "0.5", "-0.0",
     "random", "yes", "no", " ", "a,b", "kill:1@2", "stop:0@1+1s", "broker@3", "kill:99@1"]
)  # fmt: skip
numbers = st.one_of(
    st.integers(-5, 40).map(str),
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
    st.integers().map(str),
)
text = st.text(alphabet=st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=12)


def _value(action: argparse.Action) -> st.SearchStrategy[str]:
    """Mostly a value of the flag's own kind (so the checks past argparse are reached),
    else junk."""
    if action.choices is not None:
        return st.one_of(st.sampled_from([str(c) for c in action.choices]), hostile)
    if action.dest in {"out", "config", "matrix", "edges", "membership", "run", "pcap",
                       "prepared", "launch_dir", "ca_file", "resume", "mount"}:  # fmt: skip
        return st.sampled_from(PATHS)
    kind = getattr(action.type, "__name__", "")
    if kind in ("int", "parse", "check"):  # int, flags.integer, flags.comma_list
        return st.one_of(st.integers(-2, 40).map(str), st.integers(-2, 40).map(str), hostile)
    if kind in ("float", "positive"):
        return st.one_of(st.floats(-1, 2).map(repr), st.floats(-1, 2).map(repr), numbers)
    return st.one_of(hostile, numbers, text)


@st.composite
def invocations(draw: st.DrawFn) -> list[str]:
    """A subcommand and some of its flags, each with a value of its own kind or junk."""
    commands = cli.parser()._subparsers._group_actions[0].choices  # type: ignore[union-attr]
    name = draw(st.sampled_from(sorted(commands)))
    actions = [
        a
        for a in commands[name]._actions
        if a.option_strings
        and not isinstance(a, argparse._HelpAction)
        and a.dest != "verbose"  # asks for tracebacks
    ]
    argv = [name]
    for action in draw(st.lists(st.sampled_from(actions), max_size=6, unique_by=id)):
        argv.append(action.option_strings[-1])
        if action.nargs != 0 and not (action.nargs == "?" and draw(st.booleans())):
            argv.append(draw(_value(action)))
    if draw(st.integers(0, 9)) == 0:
        argv.insert(draw(st.integers(1, len(argv))), draw(text))  # a stray word
    return argv


def _toml(value: Any) -> str:
    """`value` as a TOML value (inline arrays and tables)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return (
            "nan"
            if math.isnan(value)
            else ("inf" if value > 0 else "-inf")
            if math.isinf(value)
            else repr(value)
        )
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, list):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{json.dumps(k)} = {_toml(v)}" for k, v in value.items()) + "}"
    return str(value)


scalars = st.one_of(
    st.integers(-3, 50),
    st.integers(),
    st.floats(),
    st.booleans(),
    st.sampled_from(["atc", "all", "local-ghp", "ring", "every-round", "adult", "x", ""]),
    text,
)
toml_values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=3), max_leaves=4)


@st.composite
def toml_files(draw: st.DrawFn) -> str:
    keys = st.one_of(st.sampled_from(SETTINGS), st.from_regex(r"[a-z_]{1,8}", fullmatch=True))
    table = draw(st.dictionaries(keys, toml_values, max_size=5))
    lines = [f"{key} = {_toml(value)}" for key, value in table.items()]
    header = ["[experiment]"] if draw(st.booleans()) else []
    return "\n".join(header + lines) + "\n"


def _small(config: Any) -> bool:
    return isinstance(config, ExperimentConfig) and config.footprint() < BUILD_LIMIT


def check(argv: list[str]) -> str:
    """One invocation through the pure layer: 'ok', 'error' (a user error on one line,
    exit 2 through main) or 'usage' (argparse's one line, exit 2); AssertionError else."""
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            _, config = cli.configure(argv)
            if _small(config):
                Instance.build(config)
    except SystemExit as exc:
        lines = err.getvalue().splitlines()
        assert exc.code in (0, 2), (argv, exc.code, err.getvalue())
        assert exc.code == 0 or len(lines) == 1, (argv, err.getvalue())
        return "usage" if exc.code else "help"
    except Exception as exc:
        message = user_error(exc)
        assert message is not None, f"{argv}: a traceback\n{traceback.format_exc()}"
        assert "\n" not in message, (argv, message)
        if not isinstance(exc, SystemExit):
            _through_main(argv)
        return "error"
    return "ok"


def _through_main(argv: list[str]) -> None:
    """What the user sees: exit 2 and one line, whatever failed in the pure layer."""
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            code = cli.main(argv)
    except SystemExit as exc:  # pragma: no cover - argparse failed in the pure layer first
        code = exc.code  # type: ignore[assignment]
    lines = err.getvalue().splitlines()
    assert code == 2 and len(lines) == 1, (argv, code, err.getvalue())
    assert "Traceback" not in err.getvalue()


def fuzz(examples: int, where: Path) -> Counter[str]:
    """`examples` invocations (one in three with a generated --config TOML) run in `where`."""
    _fixtures(where)
    OUTCOMES.clear()

    @settings(
        max_examples=examples,
        deadline=None,
        database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )
    @given(argv=invocations(), toml=st.one_of(st.none(), toml_files()))
    def one(argv: list[str], toml: str | None) -> None:
        if toml is not None:
            (where / "exp.toml").write_text(toml)
            argv = [*argv, "--config", "exp.toml"] if argv[0] in _WITH_CONFIG else argv
        OUTCOMES[check(argv)] += 1
        OUTCOMES["toml" if toml is not None else "flags only"] += 1

    here = Path.cwd()
    os.chdir(where)
    try:
        one()
    finally:
        os.chdir(here)
    return OUTCOMES


_WITH_CONFIG = ("simulate", "reproduce", "run", "dp-audit")


def test_no_input_gives_a_traceback(tmp_path: Path) -> None:
    """A few seconds of the fuzz; `python tests/test_cli_fuzz.py --examples 2000` for more."""
    outcomes = fuzz(SUITE_EXAMPLES, tmp_path)
    assert sum(outcomes[k] for k in ("ok", "error", "usage", "help")) == SUITE_EXAMPLES
    assert outcomes["error"] + outcomes["usage"] > 0  # it did reach bad input


if __name__ == "__main__":
    ask = argparse.ArgumentParser(description="the CLI fuzz, at a chosen number of examples")
    ask.add_argument("--examples", type=int, default=2000)
    n = ask.parse_args().examples
    with tempfile.TemporaryDirectory() as tmp:
        tally = fuzz(n, Path(tmp))
    print(json.dumps(dict(tally), indent=1))
    sys.exit(0)
