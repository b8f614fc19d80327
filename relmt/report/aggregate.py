"""Seeds into one figure: mean ± sample standard deviation (n), the keys the tables use, and the markdown cells."""

import math
from collections import Counter
from collections.abc import Callable, Hashable, Iterable
from dataclasses import dataclass

import numpy as np

from relmt.report.runs import METRICS, Run

PAPER_K = 16  # the paper's default clipping distance (base model)
# A split's stats key: sacreBLEU under the split's name, the other metrics prefixed ("tok:test", "chrf:valid").
PREFIX = {"bleu": "", "tokenized_bleu": "tok:", "chrf": "chrf:", "lowercased_bleu": "lc:"}


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


def tok(split: str) -> str:
    return key(split, "tokenized_bleu")


def bleu_stats(runs: list[Run], splits: list[str]) -> dict[str, Stat | None]:
    """Every metric of the final validation and of each test split over `runs`, by `key`."""
    return {key(s, m): aggregate(r.score(s, m) for r in runs) for m in METRICS for s in ("valid", *splits)}


def ordered_union(lists: Iterable[Iterable[str]]) -> list[str]:
    return list(dict.fromkeys(x for xs in lists for x in xs))


def seeds_of(runs: Iterable[Run]) -> list[int]:
    return sorted({r.seed for r in runs if r.seed is not None})


def default_k(runs: list[Run]) -> int | None:
    """The most common k among rel runs with a^K and a^V on (of both runs if there is none); ties (a k
    sweep with as many seeds per k as the shared rel run) go to the k most used by both, then to the
    paper's 16, then to the smallest k."""
    rel, both = (Counter(r.k for r in runs if r.positions == p and r.full_rel) for p in ("rel", "both"))
    counts = rel or both
    return max(counts, key=lambda k: (counts[k], both[k], k == PAPER_K, -k)) if counts else None


Rows = list[tuple[Hashable, list[Run], dict[str, Stat | None]]]


def grouped_rows(runs: list[Run], by: Callable[[Run], Hashable], order: Iterable[Hashable], splits: list[str]) -> Rows:
    """(key value, its runs, their stats) for each key value in `order` that has runs."""
    rows = [(value, [r for r in runs if by(r) == value]) for value in order]
    return [(value, members, bleu_stats(members, splits)) for value, members in rows if members]

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
