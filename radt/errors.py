"""The one kind of error a user fixes: every radt command prints it as one line and exits 2.

Both sides raise subclasses (a bad option, an unreachable store, a bad CSV row); the command
line in radt/cli.py catches this base class without importing either side.
"""

from __future__ import annotations

import sys


class UserError(Exception):
    """A mistake or an outage the user can fix; the message names the problem and the fix."""


def report(message: str) -> None:
    """One line to stderr, flushed at once: how radt's processes tell the user what happens while a run goes on."""
    print(message, file=sys.stderr, flush=True)
