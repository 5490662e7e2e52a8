"""The one exception type users see: a clear, one-line message, no traceback."""

from __future__ import annotations


class TopasError(Exception):
    """A problem with the user's input or environment, reported as one line by the CLI."""


class UnknownNameError(TopasError, KeyError):
    """A name that is not in a registry; the message lists the known names."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0])
