"""``python -m rlpipe.runtime ARGS``: one stage process (what ``rlpipe run`` and ``torchrun`` start)."""

import argparse
import os
import sys

from rlpipe.errors import InputError
from rlpipe.runtime.config import add_run_arguments, config_from_args
from rlpipe.runtime.processes import report_failure
from rlpipe.runtime.worker import run_worker


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m rlpipe.runtime",
                                     description="One pipeline stage process (started by rlpipe run or torchrun).")
    add_run_arguments(parser)
    args = parser.parse_args()
    rank = int(os.environ.get("RANK", "0"))
    try:
        run_worker(config_from_args(args))
    except InputError as err:
        report_failure(rank, err)
        print(f"rlpipe run: error: {err}", file=sys.stderr)
        return 2
    except BaseException as err:  # a bug, or a peer that went away: the launcher names who failed first
        report_failure(rank, err)
        raise
    return 0


if __name__ == "__main__":
    sys.exit(main())
