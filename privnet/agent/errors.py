"""The one error a configuration that cannot run raises (re-exported by privnet.agent.spec).

It lives apart so that modules below the spec, the scheme registry among them, can raise
it without importing the spec that imports them."""

from __future__ import annotations


class ConfigError(ValueError):
    """A configuration that cannot run; the message says what is wrong and how to fix it."""
