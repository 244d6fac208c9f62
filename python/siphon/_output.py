"""What the exports and dashboards share about what they write, checked before any work:

- their folders are new or empty (`check_new_or_empty`), so that siphon never writes over or
  beside a user's files; ``siphon dashboard`` and ``siphon export neuronpedia`` check the same
  in the binary before they compute their effects (``crates/cli/src/cmd/dashboard/mod.rs``,
  ``new_or_empty``), in the same words;
- their count settings lie in their ranges (`check_count`): an error names the setting and
  its command-line flag, not an allocation that takes the machine's memory.
"""

from __future__ import annotations

import operator
import os
from typing import Any, Optional, Union

from .errors import DatasetError


def check_new_or_empty(
    folder: Union[str, "os.PathLike[str]"], holds: str, *, besides: Union[None, str, "os.PathLike[str]"] = None
) -> None:
    """Refuses `folder` unless it does not exist yet or is an empty directory, naming it and
    `holds` (what goes there, e.g. ``"the batch files"``). `besides`: a path inside `folder`
    that may already be there (the effects directory ``siphon dashboard`` writes into its
    ``--out`` before the pages)."""
    path = os.fspath(folder)
    if not os.path.lexists(path):
        return
    if not os.path.isdir(path):
        raise DatasetError(f"{path}: not a folder ({holds} go into a new or empty folder)")
    allowed = os.path.abspath(os.fspath(besides)) if besides is not None else None
    with os.scandir(path) as entries:
        if any(os.path.abspath(entry.path) != allowed for entry in entries):
            raise DatasetError(f"{path}: not empty ({holds} go into a new or empty folder)")


def check_count(name: str, value: Any, least: int, most: int, *, flag: Optional[str] = None,
                least_is: Optional[str] = None, most_is: Optional[str] = None) -> int:
    """`value` as an int when it is a whole number in ``least..=most``; otherwise an error
    naming the setting `name` and its flag (`flag`, default ``--`` and `name` dashed), and
    what the bound it passed is (`least_is`, `most_is`: e.g. ``"the 96 latents of …"``)."""
    shown = f"{name} ({flag or '--' + name.replace('_', '-')})"
    try:
        number = operator.index(value)
    except TypeError:
        raise DatasetError(f"{shown} must be a whole number, got {value!r}") from None
    for wrong, bound, side, meaning in ((number < least, least, "least", least_is), (number > most, most, "most", most_is)):
        if wrong:
            raise DatasetError(f"{shown} must be at {side} {bound}{f' ({meaning})' if meaning else ''}, got {number}")
    return number
