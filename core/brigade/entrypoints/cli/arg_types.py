"""argparse ``type=`` functions shared by the subcommands: a bad value is one line naming what would be right."""

from __future__ import annotations

import argparse
from urllib.parse import ParseResult, urlparse


def _int(text: str, least: int) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number of at least {least}, got {text!r}") from None
    if value < least:
        raise argparse.ArgumentTypeError(f"must be at least {least}, got {value}")
    return value


def positive_int(text: str) -> int:
    """argparse type: an int of at least 1."""
    return _int(text, 1)


def non_negative_int(text: str) -> int:
    """argparse type: an int of at least 0."""
    return _int(text, 0)


def http_url(text: str, expected: str) -> ParseResult:
    """The parts of an http(s) URL with a host and a valid port (if any); ``expected`` ends the error line.

    Raises:
        argparse.ArgumentTypeError: another scheme, no host, or a bad port.
    """
    url = urlparse(text.strip())
    if url.scheme not in ("http", "https") or not url.hostname:
        raise argparse.ArgumentTypeError(f"{text!r} is not an http(s) URL; {expected}")
    try:
        url.port
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} has a bad port; {expected}") from None
    return url
