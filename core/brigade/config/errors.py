"""ConfigError: the one exception a bad setting raises, with a one-line message."""

from __future__ import annotations


class ConfigError(ValueError):
    """A bad setting; the message says what is wrong and what would be right, in one line."""
