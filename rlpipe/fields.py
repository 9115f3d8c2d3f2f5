"""Check the fields of a configuration dataclass read from a file against their type hints, so a wrong
type (a string where a number goes, a list where a mapping goes, NaN, a boolean for a count) is one
:class:`~rlpipe.errors.InputError` naming the field, not a traceback deep inside training."""

from __future__ import annotations

import math
import types
import typing
from dataclasses import fields, is_dataclass
from typing import Any

from rlpipe.errors import InputError


def check_field_types(instance: Any, source: str, infinite_ok: tuple[str, ...] = ()) -> None:
    """Raise an InputError ``"<source>: <field>: expected <type>, got <value>"`` for the first field of
    the dataclass ``instance`` whose value does not fit its annotation. Numbers must be finite (those of
    the fields in ``infinite_ok`` may also be infinite); ``int`` fields refuse booleans and floats."""
    assert is_dataclass(instance)
    hints = typing.get_type_hints(type(instance))
    for f in fields(instance):
        value = getattr(instance, f.name)
        if not fits(value, hints[f.name], allow_inf=f.name in infinite_ok):
            shown = repr(value) if len(repr(value)) <= 60 else repr(value)[:57] + "..."
            raise InputError(f"{source}: {f.name}: expected {describe(hints[f.name])}, got {shown}")


def is_number(value: Any, allow_inf: bool = False) -> bool:
    """An int or a finite float (infinite too if ``allow_inf``; never NaN, never a boolean). An int of
    any size counts: ``math.isfinite`` would overflow on one too large for a float."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    return isinstance(value, int) or math.isfinite(value) or (allow_inf and not math.isnan(value))


def fits(value: Any, hint: Any, allow_inf: bool = False) -> bool:
    """Whether ``value`` fits the type hint ``hint`` (the subset of typing our configs use); floats must
    be finite unless ``allow_inf`` (NaN never fits)."""
    if hint is Any:
        return True
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        return any(fits(value, arg, allow_inf) for arg in args)
    if hint is type(None):
        return value is None
    if hint is bool:
        return isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if hint is float:
        return is_number(value, allow_inf)
    if hint is str:
        return isinstance(value, str)
    if origin in (tuple, list):
        if not isinstance(value, (tuple, list)):
            return False
        if origin is tuple and len(args) == 2 and args[1] is Ellipsis:
            return all(fits(item, args[0], allow_inf) for item in value)
        if origin is tuple and args:
            return len(value) == len(args) and all(fits(item, arg, allow_inf) for item, arg in zip(value, args))
        return all(fits(item, args[0], allow_inf) for item in value) if args else True
    if origin is dict:
        return isinstance(value, dict) and all(isinstance(key, str) for key in value)
    if isinstance(hint, type):
        return isinstance(value, hint)
    return True  # a hint this checker does not know: the field's own checks apply


def describe(hint: Any, plural: bool = False) -> str:
    """A type hint as a user reads it: ``an integer``, ``a list of finite numbers``, ``a string or null``."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        return " or ".join(describe(arg, plural) for arg in args)
    names = {int: ("an integer", "integers"), float: ("a finite number", "finite numbers"),
             str: ("a string", "strings"), bool: ("true or false", "booleans"), type(None): ("null", "nulls")}
    if hint in names:
        return names[hint][plural]
    if origin in (tuple, list):
        if origin is tuple and args and args[-1] is not Ellipsis:
            return f"a list of {len(args)} {describe(args[0], plural=True)}"
        return f"a list of {describe(args[0], plural=True)}" if args else "a list"
    if origin is dict:
        return "a mapping"
    return getattr(hint, "__name__", str(hint))
