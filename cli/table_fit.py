"""A `TextTable` drawn by rich within the terminal's width, no cell cut.

Left to itself, rich squeezes a table wider than the terminal by cutting cells to "02…" or "1.…",
which hides the figures the table is for. Here the widths are chosen first: a short cell (a time,
a size, a loss: up to `WHOLE_CELL` characters) stays on one line, longer text and headers wrap at
spaces (a very long word in long text, an address, may fold at `FOLDED_WORD` characters), and the
widest columns give way first. When even that is too wide, the table's optional columns are left
out (the least useful first, as its maker ordered them; a caption names them); when it is still
too wide, each row is drawn as "header  value" lines instead.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .common import TextTable

GAP = 2  # spaces between columns, as in the plain text
WHOLE_CELL = 16  # cells up to this long are never wrapped: "188.6 KiB" on two lines reads as two cells
FOLDED_WORD = 24  # the narrowest a column with a longer word in a long cell gets: that word folds


class FittedTable:
    """A rich renderable that lays `table` out for the width it is drawn at (so a live view
    follows the terminal when it is resized)."""

    def __init__(self, table: TextTable) -> None:
        self.table = table

    def __rich_console__(self, console: Any, options: Any) -> Any:
        table = self.table
        yield pairs_grid(table.rows) if table.header is None else fitted(table, options.max_width)


def fitted(table: TextTable, width: int) -> Any:
    """`table`'s columns within `width`: all that fit at their narrowest, else a vertical layout."""
    shown = columns_that_fit(table, width)
    if shown is None:
        return vertical(table)
    natural, narrowest = _natural_widths(table, shown), _narrowest_widths(table, shown)
    return _columns_table(table, shown, squeeze(natural, narrowest, width - GAP * (len(shown) - 1)))


def columns_that_fit(table: TextTable, width: int) -> list[int] | None:
    """The indexes of the columns to show at `width`: all but the optional ones left out, the first
    of `table.optional` first, until the rest fit at their narrowest; None if not even the others do."""
    shown = list(range(len(table.header or ())))
    left_out = [table.header.index(name) for name in table.optional if name in table.header]
    while sum(_narrowest_widths(table, shown)) + GAP * (len(shown) - 1) > width:
        if not left_out:
            return None
        shown.remove(left_out.pop(0))
    return shown


def squeeze(natural: Sequence[int], narrowest: Sequence[int], room: int) -> list[int]:
    """Column widths from `natural` that add up to at most `room`, the widest one narrowed first,
    none below its `narrowest` (the caller made sure those fit)."""
    widths = list(natural)
    while sum(widths) > room:
        squeezable = [column for column in range(len(widths)) if widths[column] > narrowest[column]]
        if not squeezable:
            break
        widths[max(squeezable, key=lambda column: widths[column])] -= 1
    return widths


def _cells(table: TextTable, column: int) -> list[str]:
    return [row[column] for row in table.rows]


def _natural_widths(table: TextTable, shown: list[int]) -> list[int]:
    assert table.header is not None
    return [max(len(cell) for cell in [table.header[column], *_cells(table, column)]) for column in shown]


def _narrowest_widths(table: TextTable, shown: list[int]) -> list[int]:
    """The width below which a column would cut a word of its header or a cell of it."""
    assert table.header is not None
    return [max(_longest_word(table.header[column]), *(_unbreakable(cell) for cell in _cells(table, column)))
            for column in shown]


def _unbreakable(cell: str) -> int:
    return len(cell) if len(cell) <= WHOLE_CELL else min(_longest_word(cell), FOLDED_WORD)


def _longest_word(text: str) -> int:
    return max((len(word) for word in text.split()), default=0)


def _columns_table(table: TextTable, shown: list[int], widths: list[int]) -> Any:
    from rich import box
    from rich.table import Table
    from rich.text import Text

    assert table.header is not None
    left_out = [name for column, name in enumerate(table.header) if column not in shown]
    caption = f"too narrow for {', '.join(left_out)}: a wider terminal or --json shows them" if left_out else None
    # No edge and one space of padding besides the box's one-space divider: GAP spaces between columns.
    drawn = Table(box=box.SIMPLE_HEAD, header_style="bold", show_edge=False, pad_edge=False,
                  padding=(0, GAP - 1, 0, 0), caption=caption, caption_justify="left")
    for column, width in zip(shown, widths):
        numbers = bool(table.rows) and all(_number(cell) for cell in _cells(table, column))
        drawn.add_column(table.header[column], justify="right" if numbers else "left", width=width, overflow="fold")
    for row in table.rows:
        drawn.add_row(*(Text(row[column]) for column in shown))  # Text: a "[...]" in a cell is not markup
    return drawn


def vertical(table: TextTable) -> Any:
    """Each row as "header  value" lines, a blank line between rows: for terminals narrower than
    the table's essential columns."""
    from rich.console import Group
    from rich.text import Text

    assert table.header is not None
    blocks: list[Any] = []
    for row in table.rows:
        if blocks:
            blocks.append(Text(""))
        blocks.append(pairs_grid(list(zip(table.header, row))))
    return Group(*blocks)


def pairs_grid(rows: Sequence[tuple[str, str]]) -> Any:
    """"label  value" lines; a value too long for the line wraps at spaces, and a word longer than
    the line (an address) folds onto the next line rather than losing its end."""
    from rich.table import Table
    from rich.text import Text

    grid = Table.grid(padding=(0, GAP))
    grid.add_column(style="bold cyan", no_wrap=True)
    grid.add_column(overflow="fold")
    for label, value in rows:
        grid.add_row(Text(label), Text(value))
    return grid


def _number(cell: str) -> bool:
    """Does the cell read as a number ("-" for none, a unit after it: "94 KiB")?"""
    if cell == "-":
        return True
    try:
        float(cell.split(" ")[0])
    except ValueError:
        return False
    return True
