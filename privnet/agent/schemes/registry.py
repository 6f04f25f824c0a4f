"""The privacy schemes by name: `Scheme`, the name a config, a spec and the wire carry, and
the part (privnet.agent.schemes.base.SchemePart) each name stands for.

A name is a `str` (configs and frames hold the plain string, byte for byte as before);
`Scheme(name)` is the registered one or a ConfigError listing them all, and iterating
`Scheme` gives them in registration order: privnet's own first (the order every table and
figure shows them in), then any registered with `register`. privnet's own parts are
imported on first use (`Scheme.part`), so naming a scheme needs no numpy.

This module and the scheme modules are the only places that name a scheme: everything else
asks the part (`scheme.part.draws`, `.masked`, `.homomorphic`, ...).
"""

from __future__ import annotations

import importlib
import re
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, ClassVar

from privnet.agent.errors import ConfigError

if TYPE_CHECKING:
    from privnet.agent.schemes.base import SchemePart

NAME = re.compile(r"[a-z][a-z0-9-]{0,31}")  # what a scheme's name may look like
# privnet's own, in the order they are shown: the module and class of each part.
BUILTIN = {
    "none": "privnet.agent.schemes.none:Clear",
    "random": "privnet.agent.schemes.random:Random",
    "ghp": "privnet.agent.schemes.ghp:Ghp",
    "local-ghp": "privnet.agent.schemes.local_ghp:LocalGhp",
    "masked-ghp": "privnet.agent.schemes.masked_ghp:MaskedGhp",
}


class _Registered(type):
    """Iterating the class `Scheme` gives every registered name, as iterating an enum does."""

    def __iter__(cls) -> Iterator[Scheme]:
        return iter(tuple(_NAMES.values()))

    def __len__(cls) -> int:
        return len(_NAMES)


class Scheme(str, metaclass=_Registered):
    """A registered privacy scheme's name; one object per name, so `is` compares them."""

    __slots__ = ()
    # privnet's own, bound below (the only names code may spell out: CLI defaults, tests).
    NONE: ClassVar[Scheme]
    RANDOM: ClassVar[Scheme]
    GHP: ClassVar[Scheme]
    LOCAL_GHP: ClassVar[Scheme]
    MASKED_GHP: ClassVar[Scheme]

    def __new__(cls, name: str) -> Scheme:
        found = _NAMES.get(name)
        if found is None:
            raise ConfigError(
                f"unknown scheme {name!r}; choose one of {', '.join(_NAMES)} (a scheme of "
                "your own: privnet.agent.schemes.registry.register)"
            )
        return found

    def __reduce__(self) -> tuple[Any, ...]:
        return (Scheme, (str(self),))  # unpickled as the registered name

    def __copy__(self) -> Scheme:
        return self

    def __deepcopy__(self, memo: object) -> Scheme:
        return self

    @property
    def value(self) -> str:
        """The plain string (as an enum member's value)."""
        return str(self)

    @property
    def part(self) -> SchemePart:
        """What this scheme does: its release, what it needs agreed, how it is accounted."""
        part = _PARTS.get(self)
        return part if part is not None else _load(self)

    @property
    def masked(self) -> bool:
        """Pairwise masks from key agreements, cancelling at each hub (released on the grid)."""
        return self.part.masked

    @property
    def homomorphic(self) -> bool:
        """One draw per sender, cancelled in the Perron-weighted network sum (needs a_pp > 0)."""
        return self.part.homomorphic


_NAMES: dict[str, Scheme] = {name: str.__new__(Scheme, name) for name in BUILTIN}
_PARTS: dict[str, SchemePart] = {}


def _load(name: str) -> SchemePart:
    """Import privnet's own part for `name` (once)."""
    module, _, attribute = BUILTIN[name].partition(":")
    part: SchemePart = getattr(importlib.import_module(module), attribute)()
    if part.name != name:
        raise TypeError(f"{BUILTIN[name]} names itself {part.name!r}, registered as {name!r}")
    _PARTS[name] = part
    return part


def register(part: SchemePart) -> Scheme:
    """Add a scheme: `part.name` becomes a Scheme every engine that runs the agents' own
    cores accepts (the memory engine; the processes of a networked run import it too when
    the module that registers it is imported there). ConfigError for a name taken or
    malformed."""
    name = part.name
    if not NAME.fullmatch(name):
        raise ConfigError(
            f"scheme name {name!r}: use 1 to 32 lowercase letters, digits or '-', "
            "starting with a letter"
        )
    if name in _NAMES:
        raise ConfigError(f"scheme {name!r} is registered already; choose another name")
    scheme = _NAMES[name] = str.__new__(Scheme, name)
    _PARTS[name] = part
    return scheme


def unregister(name: str) -> None:
    """Remove a scheme `register` added (privnet's own stay)."""
    if name in BUILTIN:
        raise ConfigError(f"scheme {name!r} is privnet's own and cannot be removed")
    if name not in _NAMES or name not in _PARTS:
        raise ConfigError(f"scheme {name!r} is not registered")
    del _NAMES[name], _PARTS[name]


Scheme.NONE = _NAMES["none"]
Scheme.RANDOM = _NAMES["random"]
Scheme.GHP = _NAMES["ghp"]
Scheme.LOCAL_GHP = _NAMES["local-ghp"]
Scheme.MASKED_GHP = _NAMES["masked-ghp"]
