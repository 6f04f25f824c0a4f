"""Plug-ins by name: privnet's own, an installed entry point, or `module:attribute`.

Problems and datasets travel in an agent's sealed Setup by name (and public parameters),
never as pickled code, so every agent looks the same name up here and must be able to
import it: privnet's own plug-ins, an entry point of an installed distribution in the
group `privnet.<kind>s` (`privnet.problems`, `privnet.datasets`, `privnet.partitions`), or
`module:attribute` on the import path. A module that is not there is looked up once more in
the working directory, searched last, so that a user's `agent.py` or `orchestrator.py`
there never shadows privnet's own packages.
"""

from __future__ import annotations

import importlib
import os
import re
import sys
from collections.abc import Mapping
from importlib import metadata
from typing import Any

from privnet.agent.spec import ConfigError

# A registered name (least-squares, my_loss) or module.path:Attribute.
NAME = re.compile(r"[A-Za-z_][\w.-]*(:[A-Za-z_][\w.]*)?")
MAX_NAME = 200


def check_name(kind: str, name: str) -> None:
    """ConfigError unless `name` can name a plug-in (syntax only; nothing is imported)."""
    if len(name) > MAX_NAME or not NAME.fullmatch(name):
        raise ConfigError(
            f"{kind} {name!r} is not a plug-in name: give a registered name (letters, digits, "
            f"'-', '_', '.') or module:Attribute"
        )


def find(kind: str, name: str, builtin: Mapping[str, str]) -> Any:
    """The object `name` stands for; ConfigError naming where it was looked for."""
    check_name(kind, name)
    target = builtin.get(name)
    if target is None and ":" not in name:
        target = entry_points(kind).get(name)
    if target is None and ":" not in name:
        known = sorted({*builtin, *entry_points(kind)})
        raise ConfigError(
            f"unknown {kind} {name!r}; known: {', '.join(known)} (or an entry point in group "
            f"privnet.{kind}s, or module:Attribute)"
        )
    return _load(kind, target or name)


def entry_points(kind: str) -> dict[str, str]:
    """Registered plug-ins of one kind: entry point name -> `module:attribute`."""
    return {ep.name: ep.value for ep in metadata.entry_points(group=f"privnet.{kind}s")}


def _load(kind: str, target: str) -> Any:
    module_name, _, attribute = target.partition(":")
    try:
        module = _module(module_name)
    except ImportError as exc:
        raise ConfigError(
            f"{kind} {target!r}: cannot import {module_name!r} ({exc}); install it, or put "
            "it on PYTHONPATH or in the working directory"
        ) from None
    obj: Any = module
    for part in attribute.split(".") if attribute else ():
        if not hasattr(obj, part):
            raise ConfigError(f"{kind} {target!r}: module {module_name!r} has no {attribute!r}")
        obj = getattr(obj, part)
    return obj


def _module(name: str) -> Any:
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as exc:
        if exc.name is None or not name.startswith(exc.name):
            raise  # the module exists but one of its imports does not
    cwd = os.getcwd()
    if cwd in sys.path:
        raise ModuleNotFoundError(f"no module named {name!r}", name=name)
    sys.path.append(cwd)  # last: nothing here shadows an installed package
    return importlib.import_module(name)
