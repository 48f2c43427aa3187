"""What a search may be restricted to: the videos under a folder (``--under PATH``) and the windows that share some
time with a span (``--between START,END``), checked and normalised once, whichever store answers.

``--under`` takes a path as the index lists its videos (relative to the indexed folder, POSIX): a folder keeps the
videos inside it at any depth, a file keeps that video. It matches whole path components — ``holiday`` keeps
``holiday/beach.mp4`` but not ``holidays/x.mp4`` — so a store can match it exactly against each video's list of path
prefixes (:func:`path_prefixes`: one keyword per ancestor folder and the file itself), an index every vector engine
has. ``--between START,END`` (seconds, START < END) keeps a window [s, e] that shares some time with [START, END]:
s < END and e > START, the test ``tvr eval-search`` uses for a labelled moment.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import numpy as np

from tvr.utils.errors import UserError


class FilterError(UserError, ValueError):
    """A ``--under`` or ``--between`` value that does not say a folder or a time span."""


@dataclasses.dataclass(frozen=True)
class WindowFilter:
    """The windows a search may return: ``under`` (a normalised relative path, or None for every video) and
    ``between`` ((start, end) seconds, or None for every window)."""

    under: str | None = None
    between: tuple[float, float] | None = None

    def __bool__(self) -> bool:
        return self.under is not None or self.between is not None

    def keeps_video(self, video: str) -> bool:
        """Whether the video at relative path ``video`` lies under :attr:`under`."""
        return self.under is None or video == self.under or video.startswith(self.under + "/")

    def keeps_times(self, times: np.ndarray) -> np.ndarray:
        """Which windows of ``times`` ([n, 2] start, end seconds) share time with :attr:`between`."""
        times = np.asarray(times)
        if self.between is None:
            return np.ones(len(times), dtype=bool)
        start, end = self.between
        return (times[:, 0] < end) & (times[:, 1] > start)

    def to_dict(self) -> dict[str, Any]:
        return {"under": self.under, "between": list(self.between) if self.between is not None else None}


def path_prefixes(video: str) -> list[str]:
    """Every path ``--under`` may name for ``video``: its ancestor folders and itself (``a/b/c.mp4`` → ``a``,
    ``a/b``, ``a/b/c.mp4``)."""
    parts = video.split("/")
    return ["/".join(parts[: n + 1]) for n in range(len(parts))]


def parse_under(value: Any) -> str | None:
    """``--under``'s value normalised (``./a//b/`` → ``a/b``), or None when not given; an absolute path, one with a
    ``..`` part, or one naming nothing is refused."""
    if value is None:
        return None
    text = str(value).strip()
    parts = [part for part in text.split("/") if part not in ("", ".")]
    if not parts or text.startswith("/") or ".." in parts or "\0" in text:
        raise FilterError(
            f"--under {text!r}: expected a folder or video as the index lists it, relative to the indexed folder "
            "(e.g. holiday/2024)"
        )
    return "/".join(parts)


def parse_between(value: Any) -> tuple[float, float] | None:
    """``--between START,END`` as (start, end) seconds, or None when not given: two finite numbers, 0 ≤ START < END."""
    if value is None:
        return None
    if isinstance(value, (tuple, list)) and len(value) == 2:
        parts = [str(v) for v in value]
    else:
        parts = str(value).split(",")
    problem = f"--between {value!r}: expected START,END in seconds with 0 <= START < END (e.g. 60,120)"
    if len(parts) != 2:
        raise FilterError(problem)
    try:
        start, end = (float(p.strip()) for p in parts)
    except ValueError:
        raise FilterError(problem) from None
    if not (math.isfinite(start) and math.isfinite(end) and 0 <= start < end):
        raise FilterError(problem)
    return start, end


def window_filter(under: Any = None, between: Any = None) -> WindowFilter | None:
    """The filter of ``--under`` / ``--between`` (either may be None), or None when neither restricts anything."""
    where = WindowFilter(parse_under(under), parse_between(between))
    return where if where else None
