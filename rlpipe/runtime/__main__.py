"""``python -m rlpipe.runtime ARGS``: one stage process (what ``torchrun`` starts; ``rlpipe run`` forks the
same :func:`stage_main` in each of its stage processes)."""

import argparse
import os
import signal
import sys
from types import FrameType

from rlpipe.errors import InputError, UserCodeError
from rlpipe.runtime.config import RunConfig, add_run_arguments, config_from_args
from rlpipe.runtime.processes import report_failure
from rlpipe.runtime.worker import run_worker

INTERRUPTED = 130  # what a shell reports for a program ended by Ctrl-C


def stage_main(config: RunConfig) -> int:
    """The whole life of one stage process; returns its exit status: 0, 2 for a user's mistake (one line
    on stderr), 130 when interrupted (Ctrl-C), and an exception (with its traceback) for anything else."""
    rank = int(os.environ.get("RANK", "0"))
    interrupted = False

    def on_interrupt(signum: int, frame: FrameType | None) -> None:
        nonlocal interrupted
        interrupted = True
        raise KeyboardInterrupt

    signal.signal(signal.SIGINT, on_interrupt)
    try:
        run_worker(config)
    except InputError as err:
        report_failure(rank, err)
        print(f"rlpipe run: error: {err}", file=sys.stderr)
        if isinstance(err, UserCodeError):
            print(err.details.rstrip(), file=sys.stderr)
        return 2
    except BaseException as err:  # a bug, or a peer that went away: the launcher names who failed first
        if interrupted:
            return INTERRUPTED
        report_failure(rank, err)
        raise
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m rlpipe.runtime",
                                     description="One pipeline stage process (started by rlpipe run or torchrun).")
    add_run_arguments(parser)
    try:
        config = config_from_args(parser.parse_args())
    except InputError as err:
        print(f"rlpipe run: error: {err}", file=sys.stderr)
        return 2
    return stage_main(config)


if __name__ == "__main__":
    sys.exit(main())
