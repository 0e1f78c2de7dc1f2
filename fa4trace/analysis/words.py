"""A count and its noun in the right number ("1 stage", "2 stages"), and a config value in words
("true", "a,b"), for every text fa4trace writes: the CLI's summaries (fa4trace.analysis.text)
and the viewer alike.

A leaf module (it imports nothing), so any layer may use it.
"""

from __future__ import annotations

__all__ = ["plural", "noun", "config_value"]


def noun(n, one: str, many: str | None = None, spec: str = "") -> str:
    """``one`` when ``n`` prints as exactly 1 (with format ``spec``), else ``many`` (default
    ``one`` + "s"): a median of 1.2 counts printed as "1" reads "1 count"."""
    return one if format(n, spec) == "1" else (many or one + "s")


def plural(n, one: str, many: str | None = None, spec: str = ",") -> str:
    """``n`` formatted by ``spec`` (default: thousands separated) and its noun:
    ``plural(1, "stage")`` -> "1 stage", ``plural(1024, "row")`` -> "1,024 rows",
    ``plural(3, "launch", "launches")`` -> "3 launches"."""
    return f"{format(n, spec)} {noun(n, one, many, spec)}"


def config_value(v) -> str:
    """A config value in words, not Python's repr: None 'unset', True 'true', a list 'a,b' (empty:
    'none'), a dict 'k:v,k:v', a float in %g."""
    if v is None:
        return "unset"
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float):
        return f"{v:g}"
    if isinstance(v, (list, tuple)):
        return ",".join(config_value(x) for x in v) or "none"
    if isinstance(v, dict):
        return ",".join(f"{k}:{config_value(x)}" for k, x in v.items()) or "none"
    return str(v)
