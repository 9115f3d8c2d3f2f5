"""Child processes that never outlive their parent."""

import ctypes
import signal

PR_SET_PDEATHSIG = 1


def die_with_parent() -> None:
    """``preexec_fn`` for Popen (Linux): the child gets SIGKILL when its parent dies, however it dies."""
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    except OSError:  # not Linux: the parent's own clean-up still applies
        pass
