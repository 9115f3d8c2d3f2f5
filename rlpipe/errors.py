"""The one exception type for a user's mistake.

Library code raises :class:`InputError` for bad input (a malformed profile, trace or config, an
impossible request); the CLI prints its message on one line and exits with status 2, with no
traceback. Anything else that escapes is a bug in rlpipe and keeps its traceback.
"""


class InputError(ValueError):
    """Bad input from a user: the message names the file or argument and the field at fault."""


class UserCodeError(InputError):
    """The user's own code (a model factory) failed: the message names it and its error on one line, and
    ``details`` holds the user's part of the traceback, shown after it."""

    def __init__(self, message: str, details: str = ""):
        super().__init__(message)
        self.details = details
