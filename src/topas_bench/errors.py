"""The one exception type users see: a clear, one-line message, no traceback."""

from __future__ import annotations


class TopasError(Exception):
    """A problem with the user's input or environment, reported as one line by the CLI."""


class UnknownNameError(TopasError, KeyError):
    """A name that is not in a registry; the message lists the known names."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0])


def not_utf8(e: UnicodeDecodeError) -> str:
    """What a file that is not UTF-8 text holds, in a few words: ``not UTF-8 text (byte 1 is
    0xff; UTF-16 or binary?)``."""
    bad = e.object[e.start : e.start + 1]
    return f"not UTF-8 text (byte {e.start + 1:,} is 0x{bad.hex() or '??'}; UTF-16 or binary?)"
