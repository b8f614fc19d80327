"""Learning curves: validation sacreBLEU against updates, mean ± std over seeds per position kind."""

from relmt.report.aggregate import Stat, aggregate, seeds_of
from relmt.report.paper import POSITIONS
from relmt.report.runs import Run


def learning_curves(runs: list[Run]) -> dict | None:
    """{"columns", "rows": [{"step", "bleu": {kind: Stat | None}}], "seeds"} at every update any run validated at."""
    runs = [r for r in runs if r.curve]
    columns = [p for p in POSITIONS if any(r.positions == p for r in runs)]
    points = [dict(r.curve) for r in runs]
    rows = [{"step": step, "bleu": {p: aggregate(c.get(step) for r, c in zip(runs, points) if r.positions == p)
                                    for p in columns}} for step in sorted({s for c in points for s in c})]
    seeds = {p: seeds_of(r for r in runs if r.positions == p) for p in columns}
    return {"columns": columns, "rows": rows, "seeds": seeds} if runs else None


def sampled(rows: list[dict], n: int = 8) -> list[dict]:
    """At most `n` rows spread evenly over the curve, always the first and the last (the plot shows them all)."""
    if len(rows) <= n:
        return rows
    return [rows[i] for i in sorted({round(i * (len(rows) - 1) / (n - 1)) for i in range(n)})]


def best(curves: dict, column: str) -> tuple[int, Stat] | None:
    """The update with the highest mean validation BLEU of `column`, and that Stat."""
    cells = [(row["step"], row["bleu"][column]) for row in curves["rows"] if row["bleu"].get(column)]
    return max(cells, key=lambda c: c[1].mean) if cells else None
