"""Reading a user's file: whatever is wrong with it (missing, a folder, unreadable, not UTF-8, not JSON)
is one :class:`~rlpipe.errors.InputError` naming the file and what was expected of it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from rlpipe.errors import InputError


def read_text(path: str | Path, what: str) -> str:
    """The UTF-8 text of ``path``; ``what`` names the file in errors ("profile file", "run log")."""
    path = Path(path)
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise InputError(f"{path}: no such {what}") from None
    except IsADirectoryError:
        raise InputError(f"{path}: a folder, not a {what}") from None
    except UnicodeDecodeError as err:
        raise InputError(f"{path}: not a {what}: not UTF-8 text (byte {err.start})") from None
    except OSError as err:
        raise InputError(f"{path}: cannot read the {what} ({err.strerror or type(err).__name__})") from None


def read_json(path: str | Path, what: str) -> Any:
    """The JSON document in ``path`` (``NaN`` and ``Infinity`` parse: the caller checks values)."""
    try:
        return json.loads(read_text(path, what))
    except json.JSONDecodeError as err:
        raise InputError(f"{path}: not valid JSON ({err.msg} at line {err.lineno} column {err.colno})") from None
    except RecursionError:
        raise InputError(f"{path}: not valid JSON (nested too deeply)") from None
