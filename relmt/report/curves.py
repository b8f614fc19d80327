"""Learning curves: validation sacreBLEU against updates, mean ± std over seeds per position kind."""

from __future__ import annotations

from relmt.report.aggregate import Stat, aggregate, seeds_of
from relmt.report.paper import POSITIONS
from relmt.report.runs import Run

TABLE_ROWS = 8  # the markdown table samples the curve; the plot shows every validation


def learning_curves(runs: list[Run]) -> dict | None:
    """{"columns": kinds, "rows": [{"step", "bleu": {kind: Stat | None}}]} over every update any run
    validated at (runs validated at the same updates give n = seeds in every cell); None if no run
    logged validation BLEU."""
    runs = [r for r in runs if r.curve]
    if not runs:
        return None
    columns = [p for p in POSITIONS if any(r.positions == p for r in runs)]
    points = [{step: bleu for step, bleu in r.curve} for r in runs]
    steps = sorted({step for curve in points for step in curve})
    rows = [{"step": step, "bleu": {p: aggregate(c.get(step) for r, c in zip(runs, points) if r.positions == p)
                                    for p in columns}} for step in steps]
    return {"columns": columns, "rows": rows, "seeds": {p: seeds_of(r for r in runs if r.positions == p)
                                                        for p in columns}}


def sampled(rows: list[dict], n: int = TABLE_ROWS) -> list[dict]:
    """At most `n` rows spread evenly over the curve, always the first and the last."""
    if len(rows) <= n:
        return rows
    index = sorted({round(i * (len(rows) - 1) / (n - 1)) for i in range(n)})
    return [rows[i] for i in index]


def best(curves: dict, column: str) -> tuple[int, Stat] | None:
    """The update with the highest mean validation BLEU of `column`, and that Stat."""
    cells = [(row["step"], row["bleu"][column]) for row in curves["rows"] if row["bleu"].get(column)]
    return max(cells, key=lambda c: c[1].mean) if cells else None
