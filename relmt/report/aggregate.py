"""Seeds into one figure, mean ± sample standard deviation (n); the stats keys the tables use; markdown cells."""

import math
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

from relmt.report.runs import METRICS, Run

# A split's stats key: sacreBLEU under the split's name, the other metrics prefixed ("tok:test", "chrf:valid").
PREFIX = {"bleu": "", "tokenized_bleu": "tok:", "chrf": "chrf:", "lowercased_bleu": "lc:"}
DASH = "–"
PAIR_HEADER = ["seed", "baseline BLEU", "system BLEU", "system − baseline", "95% interval", "p"]


@dataclass(frozen=True)
class Stat:
    mean: float
    std: float  # sample standard deviation (ddof 1); 0 for one seed
    n: int

    def __str__(self) -> str:
        return f"{self.mean:.2f} ± {self.std:.2f} ({self.n})"


def aggregate(values: Iterable[float | None]) -> Stat | None:
    xs = np.array([v for v in values if v is not None and not math.isnan(v)], dtype=float)
    return Stat(float(xs.mean()), float(xs.std(ddof=1)) if xs.size > 1 else 0.0, int(xs.size)) if xs.size else None


def key(split: str, metric: str = "bleu") -> str:
    return PREFIX[metric] + split


def bleu_stats(runs: list[Run], splits: list[str]) -> dict[str, Stat | None]:
    """Every metric of the final validation and of each test split over `runs`, by `key`."""
    return {key(s, m): aggregate(r.score(s, m) for r in runs) for m in METRICS for s in ("valid", *splits)}


def ordered_union(lists: Iterable[Iterable[str]]) -> list[str]:
    return list(dict.fromkeys(x for xs in lists for x in xs))


def seeds_of(runs: Iterable[Run]) -> list[int]:
    return sorted({r.seed for r in runs if r.seed is not None})


def fmt(stat: Stat | float | None) -> str:
    return DASH if stat is None else str(stat) if isinstance(stat, Stat) else f"{stat:.1f}"


def md_table(header: list[str], rows: list[list[str]]) -> str:
    """A markdown table; a "|" inside a cell (e.g. "|difference|") is escaped so it does not split the cell."""
    def line(cells: list[str]) -> str:
        return "| " + " | ".join(cell.replace("|", "\\|") for cell in cells) + " |"
    return "\n".join([line(header), "|" + "|".join("---" for _ in header) + "|", *map(line, rows)])


def pair_cells(t) -> list[str]:
    """One seed pair's row (relmt.report.significance.PairTest) under PAIR_HEADER, or the test over all seeds'."""
    seed = str(t.seed) if t.seed is not None else f"all ({t.seeds[0]} + {t.seeds[1]})"
    return [seed, f"{t.baseline:.2f}", f"{t.system:.2f}", f"{t.difference:+.2f}",
            f"[{t.low:+.2f}, {t.high:+.2f}]", f"{t.p_value:.3f}"]


def plural(n: int, noun: str) -> str:
    return f"{n} {noun}" + ("" if n == 1 else "s")
