"""Tables of money for people and tools: terminal (rich), Markdown, CSV, and W&B; written atomically."""

from __future__ import annotations

import csv
import io
import logging
import math
import shutil
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from experiment.files import atomic_write_bytes, atomic_write_text
from experiment.storage import BucketPath, RunPath
from tracking.artifacts import log_files

log = logging.getLogger("cost.report")


@dataclass(frozen=True)
class Column:
    key: str
    title: str
    fmt: str = "{}"  # applied to numbers; None/NaN print as an em dash
    terminal: bool = True  # shown in the printed table (Markdown and CSV always have every column)


SIG = "sig"  # a format for amounts from kopecks to millions: 3 significant digits below 100


def significant(value: float) -> str:
    if abs(value) >= 100:
        return f"{value:,.0f}"
    if abs(value) >= 1:
        return f"{value:,.2f}"
    return f"{value:.3g}"


def cell(value: Any, fmt: str) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "—"
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return significant(value) if fmt == SIG else fmt.format(value)
    return str(value)


def to_markdown(rows: Sequence[dict[str, Any]], columns: Sequence[Column]) -> str:
    lines = ["| " + " | ".join(c.title for c in columns) + " |",
             "|" + "|".join("---" for _ in columns) + "|"]
    for row in rows:
        lines.append("| " + " | ".join(cell(row.get(c.key), c.fmt).replace("|", "\\|") for c in columns) + " |")
    return "\n".join(lines) + "\n"


def to_csv(rows: Sequence[dict[str, Any]], columns: Sequence[Column]) -> str:
    """Raw values (full precision) for tools; the header uses the keys."""
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow([c.key for c in columns])
    for row in rows:
        writer.writerow(["" if row.get(c.key) is None else row.get(c.key) for c in columns])
    return buffer.getvalue()


FALLBACK_WIDTH = 100  # columns when stdout is no terminal (a CI log, a pipe) and COLUMNS is unset


def terminal_width() -> int:
    """The terminal's width (``COLUMNS`` first, as ``shutil.get_terminal_size`` reads it), else the fallback."""
    return shutil.get_terminal_size((FALLBACK_WIDTH, 24)).columns


def _rendered_width(widths: Sequence[int]) -> int:
    """Width of a rich table with these column widths: one space of padding each side, a border between."""
    return sum(w + 2 for w in widths) + len(widths) + 1


def column_blocks(widths: Sequence[int], width: int) -> list[list[int]]:
    """Column indices per printed block: column 0 (the row's name) starts every block, then as many of the
    next columns as fit in ``width``; the rest wrap into the next block, never squeezed (a squeezed
    cell is cut or folded, and rows that differ only in a cut-off part then read the same)."""
    blocks: list[list[int]] = []
    current = [0]
    for index in range(1, len(widths)):
        if len(current) > 1 and _rendered_width([widths[i] for i in [*current, index]]) > width:
            blocks.append(current)
            current = [0]
        current.append(index)
    blocks.append(current)
    return blocks


def to_terminal(rows: Sequence[dict[str, Any]], columns: Sequence[Column], title: str,
                width: int | None = None) -> str:
    """The table for a terminal ``width`` columns wide (default: this terminal's): the first column names the
    row and repeats in every block; columns that do not fit wrap into further blocks below."""
    from rich.cells import cell_len
    from rich.console import Console
    from rich.table import Table

    width = width or terminal_width()
    columns = [c for c in columns if c.terminal]
    cells = [[cell(row.get(c.key), c.fmt) for c in columns] for row in rows]
    widths = [max([cell_len(c.title), *(cell_len(r[i]) for r in cells)]) for i, c in enumerate(columns)]
    console = Console(width=width, record=True, file=io.StringIO())
    blocks = column_blocks(widths, width)
    for number, block in enumerate(blocks):
        heading = f"{title} ({number + 1}/{len(blocks)})" if title and len(blocks) > 1 else title
        table = Table(title=heading or None, title_justify="left", min_width=min(cell_len(heading or ""), width))
        for i in block:
            table.add_column(columns[i].title, justify="left" if columns[i].fmt == "{}" else "right",
                             no_wrap=i != 0, min_width=min(widths[i], width // 2) if i == 0 else None)
        for row in cells:
            table.add_row(*(row[i] for i in block))
        console.print(table)
    return console.export_text()


def write_table(rows: Sequence[dict[str, Any]], columns: Sequence[Column], out_base: RunPath, title: str,
                preamble: str = "", notes: Sequence[str] = (),
                terminal_columns: Sequence[Column] | None = None) -> tuple[RunPath, RunPath]:
    """``<out_base>.md`` (title, preamble, table, notes) and ``<out_base>.csv``; prints the table (with
    ``terminal_columns``' order when given: its first column names each row)."""
    md = f"# {title}\n\n" + (preamble.strip() + "\n\n" if preamble.strip() else "") + to_markdown(rows, columns)
    if notes:
        md += "\n" + "\n".join(f"- {note}" for note in notes) + "\n"
    md_path, csv_path = out_base.with_suffix(".md"), out_base.with_suffix(".csv")
    atomic_write_text(md_path, md)
    atomic_write_text(csv_path, to_csv(rows, columns))
    print(to_terminal(rows, terminal_columns or columns, title), flush=True)
    for note in notes:
        print(f"  note: {note}", flush=True)
    log.info("wrote %s and %s", md_path, csv_path)
    return md_path, csv_path


def save_figure(fig: Any, path: RunPath) -> RunPath:
    """Save a matplotlib figure atomically as PNG and close it."""
    import matplotlib.pyplot as plt

    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=120, bbox_inches="tight")
    plt.close(fig)
    atomic_write_bytes(path, buffer.getvalue())
    log.info("wrote %s", path)
    return path


def log_to_wandb(wandb_run: Any, name: str, rows: Sequence[dict[str, Any]], columns: Sequence[Column],
                 images: dict[str, RunPath], files: Sequence[RunPath], artifact_type: str) -> None:
    """The table and plots into the run, and every file as one artifact (lineage for the report)."""
    if wandb_run is None or getattr(wandb_run, "disabled", False):
        return
    import PIL.Image
    import wandb

    table = wandb.Table(columns=[c.key for c in columns],
                        data=[[row.get(c.key) for c in columns] for row in rows])
    payload: dict[str, Any] = {f"{name}/table": table}
    for key, path in images.items():  # W&B takes images from local files: a bucket's is read into memory
        payload[f"{name}/{key}"] = wandb.Image(PIL.Image.open(io.BytesIO(path.read_bytes())) if isinstance(
            path, BucketPath) else str(path))
    wandb_run.log(payload)
    log_files(wandb_run, name, artifact_type, [*files, *images.values()])

