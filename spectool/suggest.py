"""Did you mean": the known name closest to a mistyped one (difflib), for error messages."""

from __future__ import annotations

import difflib
from collections.abc import Callable, Iterable


def did_you_mean(
    name: str, known: Iterable[str], key: Callable[[str], str] = str.lower
) -> str | None:
    """The known name closest to ``name`` (difflib, compared through ``key``), or None when
    nothing is close: ``h100-sxn`` -> ``h100-sxm``."""
    by_key = {key(k): k for k in known}
    typed = key(name)
    # one letter of a short name (l4, h20) is a large share of it: a looser cutoff there
    cutoff = 0.75 if len(typed) > 4 else 0.5
    close = difflib.get_close_matches(typed, list(by_key), n=1, cutoff=cutoff)
    return by_key[close[0]] if close else None


def suggestion(name: str, known: Iterable[str], key: Callable[[str], str] = str.lower) -> str:
    """`` (did you mean 'X'?)`` for an error message, or an empty string."""
    match = did_you_mean(name, known, key)
    return f" (did you mean {match!r}?)" if match else ""
