"""The one exception type for a user's mistake.

Library code raises :class:`InputError` for bad input (a malformed profile, trace or config, an
impossible request); the CLI prints its message on one line and exits with status 2, with no
traceback. Anything else that escapes is a bug in rlpipe and keeps its traceback.
"""


class InputError(ValueError):
    """Bad input from a user: the message names the file or argument and the field at fault."""
