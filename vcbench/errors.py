"""The one exception type a user can cause.

Anything raised as `UserError` is a mistake in the input (a bad path, an unknown method, a
malformed YAML key). The CLI prints it as a single `error: ...` line and exits 2; every other
exception is a bug and keeps its traceback. It is a ValueError, so Python callers of
`vcbench.attention` catch it the usual way.
"""


class UserError(ValueError):
    """A mistake in what the user asked for; the message is shown as one line."""
