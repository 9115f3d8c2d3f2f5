"""``python -m rlpipe.runtime ARGS``: one stage process (what ``rlpipe run`` and ``torchrun`` start)."""

import argparse
import sys

from rlpipe.errors import InputError
from rlpipe.runtime.config import add_run_arguments, config_from_args
from rlpipe.runtime.worker import run_worker


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m rlpipe.runtime",
                                     description="One pipeline stage process (started by rlpipe run or torchrun).")
    add_run_arguments(parser)
    try:
        config = config_from_args(parser.parse_args())
        run_worker(config)
    except InputError as err:
        print(f"rlpipe run: error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
