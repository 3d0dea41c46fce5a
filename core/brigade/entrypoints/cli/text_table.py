"""Aligned text tables and wrapped lines that fit a terminal width (``brigade plugins`` and other listings)."""

from __future__ import annotations

import textwrap
from collections.abc import Sequence
from dataclasses import dataclass

WIDTH = 100  # columns: what a listing fits when stdout is not a terminal that says otherwise
GAP = "  "  # between columns
MIN_LAST_COLUMN = 24  # the last column is never squeezed below this; the other columns are cut instead
ELLIPSIS = "…"


def wrap_text(text: str, *, width: int = WIDTH, indent: int = 0) -> list[str]:
    """``text`` as lines of at most ``width`` characters, each indented by ``indent`` spaces (words longer
    than a line are broken)."""
    pad = " " * indent
    return textwrap.wrap(text, width=width, initial_indent=pad, subsequent_indent=pad, break_on_hyphens=False) \
        or [pad.rstrip()]


def _cut(cell: str, width: int) -> str:
    return cell if len(cell) <= width else cell[:max(width - 1, 0)] + ELLIPSIS


@dataclass(frozen=True)
class TableLayout:
    """Column widths that fit ``width`` characters: every column but the last is as wide as its longest cell,
    and the last wraps under itself in what is left.

    When the other columns leave the last fewer than MIN_LAST_COLUMN characters, the widest of them are
    narrowed (their cells cut with an ellipsis) until it has that many.
    """

    widths: tuple[int, ...]  # of every column but the last
    last_width: int

    @classmethod
    def fit(cls, rows: Sequence[Sequence[str]], width: int = WIDTH) -> TableLayout:
        """The layout of ``rows`` (the header among them), each the same number of cells (at least one)."""
        num_fixed = len(rows[0]) - 1
        widths = [max(len(row[i]) for row in rows) for i in range(num_fixed)]
        budget = width - MIN_LAST_COLUMN - len(GAP) * num_fixed
        while sum(widths) > budget and max(widths, default=0) > 1:
            widest = widths.index(max(widths))
            widths[widest] -= 1
        last = max(width - sum(widths) - len(GAP) * num_fixed, MIN_LAST_COLUMN)
        return cls(tuple(widths), last)

    def format(self, row: Sequence[str]) -> list[str]:
        """One row as lines: the fixed cells on the first, the last cell wrapped under its column."""
        cells = [_cut(cell, w).ljust(w) for cell, w in zip(row, self.widths)]
        indent = sum(self.widths) + len(GAP) * len(self.widths)
        last = wrap_text(row[-1], width=self.last_width) if row[-1] else [""]
        lines = [GAP.join([*cells, last[0]]).rstrip()]
        lines += [" " * indent + line for line in last[1:]]
        return lines


def format_table(rows: Sequence[Sequence[str]], width: int = WIDTH) -> list[str]:
    """``rows`` (the header first) as aligned lines of at most ``width`` characters (TableLayout)."""
    layout = TableLayout.fit(rows, width)
    return [line for row in rows for line in layout.format(row)]
