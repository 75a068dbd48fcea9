"""The value checks of the package: one clear ValueError naming the field and what it allows.

The config, the scheme fields (positions.py) and the training app's arguments all check through these (the app
imports them from here: the model unit cannot import the app)."""

from __future__ import annotations

import difflib
import math
from collections.abc import Iterable
from typing import Any


def is_finite_number(value: Any) -> bool:
    """Whether `value` is a finite real number (an int or a float, not a bool)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def is_positive_number(value: Any) -> bool:
    """Whether `value` is a finite number (`is_finite_number`) > 0."""
    return is_finite_number(value) and value > 0


def is_non_negative_number(value: Any) -> bool:
    """Whether `value` is a finite number (`is_finite_number`) >= 0."""
    return is_finite_number(value) and value >= 0


def is_int_at_least(value: Any, minimum: int) -> bool:
    """Whether `value` is an integer (not a bool) >= `minimum`."""
    return isinstance(value, int) and not isinstance(value, bool) and value >= minimum


def require_int(name: str, value: Any, minimum: int, null_means: str | None = None, maximum: int | None = None) -> None:
    """Raise ValueError naming `name` unless `value` is an integer >= `minimum` (and <= `maximum`, if given), or None
    when the field has a `null_means` (what null stands for)."""
    if value is None and null_means is not None:
        return
    if not is_int_at_least(value, minimum) or (maximum is not None and value > maximum):
        integer = f"an integer >= {minimum}" if maximum is None else f"an integer from {minimum} to {maximum}"
        allowed = integer if null_means is None else f"null ({null_means}) or {integer}"
        raise ValueError(f"{name} must be {allowed}, got {value!r}")


def require_name_or_null(name: str, value: Any, names: str) -> None:
    """Raise ValueError naming `name` unless `value` is None or text that is not blank: a setting whose text `names`
    something (a file, a folder, a Hub id) given empty (`--train_file "$TRAIN"` with TRAIN unset) is an error, not the
    setting left unset."""
    if value is not None and not (isinstance(value, str) and value.strip()):
        raise ValueError(f"{name} must name {names}, or be null; got {value!r}")


def require_positive_number(name: str, value: Any, null_means: str | None = None) -> None:
    """Raise ValueError naming `name` unless `value` is a number > 0, or None when the field has a `null_means`."""
    if value is None and null_means is not None:
        return
    if not is_positive_number(value):
        allowed = "a positive number" if null_means is None else f"null ({null_means}) or a positive number"
        raise ValueError(f"{name} must be {allowed}, got {value!r}")


def require_non_negative_number(name: str, value: Any) -> None:
    """Raise ValueError naming `name` unless `value` is a finite number >= 0."""
    if not is_non_negative_number(value):
        raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")


def require_probability(name: str, value: Any) -> None:
    """Raise ValueError naming `name` unless `value` is a number p in [0, 1) (a dropout rate, a label-smoothing
    epsilon, an Adam beta): at p = 1 dropout drops everything and smoothing ignores the label."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 <= value < 1.0:
        raise ValueError(f"{name} must be a number in [0, 1), got {value!r}")


def closest_name(name: str, candidates: Iterable[str], cutoff: float = 0.6) -> str | None:
    """The candidate most like `name` by difflib's similarity ratio (get_close_matches' measure and cutoff), taken the
    smaller of its two orders: the ratio is not symmetric (--no-such-flag against source_lang: 0.61 one way, 0.43 the
    other), and a hint should not depend on which string is which. A candidate whose quick ratios (upper bounds of
    the ratio, as get_close_matches reads them) fall below the cutoff is passed over without computing its ratio."""
    def similarity(candidate: str) -> float:
        matcher = difflib.SequenceMatcher(None, name, candidate)
        if matcher.real_quick_ratio() < cutoff or matcher.quick_ratio() < cutoff:
            return 0.0
        return min(matcher.ratio(), difflib.SequenceMatcher(None, candidate, name).ratio())

    score, best = max(((similarity(candidate), candidate) for candidate in candidates), default=(0.0, None))
    return best if score >= cutoff else None
