"""Plain-text tables for a terminal: the scripts' task and timing tables."""

from __future__ import annotations

from typing import Any, Sequence


def format_table(header: Sequence[str], rows: Sequence[Sequence[str]], align: str) -> list[str]:
    """A plain-text table with ``|`` separators; ``align`` has one ``<`` or ``>`` per column."""
    widths = [max(len(str(c)) for c in col) for col in zip(header, *rows)]

    def line(cells: Sequence[str]) -> str:
        return " | ".join(f"{str(c):{a}{w}}" for c, a, w in zip(cells, align, widths)).rstrip()

    return [line(header), "-+-".join("-" * w for w in widths)] + [line(r) for r in rows]


def timing_table(rows: Sequence[tuple[str, Any]]) -> str:
    """Mean/Median/Max/Min/Std (ms) of named timings (:class:`~ansor.networks.Timing`), one row each."""
    head = f"{'':<14}{'Mean':>11}{'Median':>11}{'Max':>11}{'Min':>11}{'Std':>11}   (ms)"
    lines = [head, "-" * len(head)]
    for name, t in rows:
        lines.append(f"{name:<14}{t.mean_ms:>11.3f}{t.median_ms:>11.3f}{t.max_ms:>11.3f}{t.min_ms:>11.3f}"
                     f"{t.std_ms:>11.3f}")
    return "\n".join(lines)
