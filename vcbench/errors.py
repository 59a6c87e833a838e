"""The one exception type a user can cause.

Anything raised as `UserError` is a mistake in the input (a bad path, an unknown method, a
malformed YAML key). The CLI prints it as a single `error: ...` line and exits 2; every other
exception is a bug and keeps its traceback. It is a ValueError, so Python callers of
`vcbench.attention` catch it the usual way.
"""

from collections.abc import Iterable
from difflib import get_close_matches


class UserError(ValueError):
    """A mistake in what the user asked for; the message is shown as one line."""


def did_you_mean(name: object, choices: Iterable[str]) -> str:
    """"did you mean 'x'? " for the choice nearest a mistyped name (difflib's ratio 0.75 or
    more), else "": the start of an unknown name's parenthesis."""
    near = get_close_matches(name, list(choices), n=1, cutoff=0.75) if isinstance(name, str) else []
    return f"did you mean {near[0]!r}? " if near else ""
