"""Markdown building blocks: cells, tables, the seed-pair rows."""

from relmt.report.aggregate import Stat

DASH = "–"
PAIR_HEADER = ["seed", "baseline BLEU", "system BLEU", "system − baseline", "95% interval", "p"]


def fmt(stat: Stat | float | None) -> str:
    return DASH if stat is None else str(stat) if isinstance(stat, Stat) else f"{stat:.1f}"


def md_table(header: list[str], rows: list[list[str]]) -> str:
    """A markdown table; a "|" inside a cell (e.g. "|difference|") is escaped so it does not split the cell."""
    def line(cells: list[str]) -> str:
        return "| " + " | ".join(cell.replace("|", "\\|") for cell in cells) + " |"
    return "\n".join([line(header), "|" + "|".join("---" for _ in header) + "|", *map(line, rows)])


def pair_cells(t) -> list[str]:
    """One seed pair's row (relmt.report.significance.PairTest) under PAIR_HEADER."""
    return [str(t.seed), f"{t.baseline:.2f}", f"{t.system:.2f}", f"{t.difference:+.2f}",
            f"[{t.low:+.2f}, {t.high:+.2f}]", f"{t.p_value:.3f}"]


def plural(n: int, noun: str) -> str:
    return f"{n} {noun}" + ("" if n == 1 else "s")


def yes_no(flag: bool) -> str:
    return "yes" if flag else "no"
