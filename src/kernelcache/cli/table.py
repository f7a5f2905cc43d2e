"""Plain aligned text tables for ``ls`` and ``stats``.

Why not rich's Table: it measures every cell of every row twice and renders through its
segment machinery, about 0.5 ms a row; at 2,000 entries ``ls`` took over a second, past the
0.3 s a listing may take. It also reads ``[...]`` in a cell as markup, so a kernel name
expression such as ``fill<float[n]>`` lost its ``[n]``. Here a cell is its text, as it is:
the same output on a terminal, in a pipe and in a test.
"""

from __future__ import annotations

import shutil
import textwrap
from collections.abc import Sequence

_GAP = "  "


def cell(value: object) -> str:
    """value as one line of printable text (control characters from a hand-edited sidecar
    would break the alignment or reach the terminal as escape sequences)."""
    text = str(value)
    return text if text.isprintable() else "".join(c if c.isprintable() else "?" for c in text)


def width() -> int:
    """Columns to fill: $COLUMNS, else the terminal's, else 80 (a pipe)."""
    return shutil.get_terminal_size((80, 24)).columns


def render(
    title: str,
    headers: Sequence[str],
    rows: Sequence[Sequence[str]],
    *,
    right: Sequence[int] = (),
    fold_last: int = 0,
    columns: int | None = None,
) -> str:
    """The table as text: a title line, the headers, a rule, one line per row.

    Cells are never shortened. ``right``: indexes of right-aligned columns. ``fold_last``
    (a minimum width, 0: off): the last column takes what is left of ``columns`` (at least
    that minimum) and folds onto continuation lines beneath itself instead of widening the
    table.
    """
    rows = [[cell(c) for c in r] for r in rows]
    heads = [cell(h) for h in headers]
    n = len(heads)
    widths = [max([len(heads[i])] + [len(r[i]) for r in rows]) for i in range(n)]
    if fold_last and n:
        used = sum(widths[:-1]) + len(_GAP) * (n - 1)
        widths[-1] = min(widths[-1], max(fold_last, (columns or width()) - used))
    indent = " " * (sum(widths[:-1]) + len(_GAP) * (n - 1))

    def line(cells: Sequence[str]) -> list[str]:
        parts = [c.rjust(w) if i in right else c.ljust(w) for i, (c, w) in enumerate(zip(cells[:-1], widths))]
        last, w = cells[-1], widths[-1] or 1
        # Words (kernel names) stay whole: a name longer than the width gets a line of its
        # own that runs past it, rather than being cut where nobody can search for it.
        wrap = textwrap.wrap(last, w, break_on_hyphens=False, break_long_words=False) if len(last) > w else [last]
        chunks = wrap or [""]
        first = _GAP.join([*parts, chunks[0].rjust(w) if n - 1 in right else chunks[0]]).rstrip()
        return [first] + [(indent + c).rstrip() for c in chunks[1:]]

    out = [title, *line(heads), _GAP.join("-" * w for w in widths)]
    for r in rows:
        out.extend(line(r))
    return "\n".join(out)
