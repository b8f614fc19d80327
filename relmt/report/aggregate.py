"""Seeds into one figure: mean ± sample standard deviation (n), and the keys the tables use."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Hashable, Iterable
from dataclasses import dataclass

import numpy as np

from relmt.report.runs import METRICS, Run

PAPER_K = 16  # the paper's default clipping distance (base model)
# The stats key of each metric of a split: sacreBLEU under the split's own name (the main figure),
# the others under a prefix, e.g. "tok:test", "chrf:valid".
PREFIX = {"bleu": "", "tokenized_bleu": "tok:", "chrf": "chrf:", "lowercased_bleu": "lc:"}


@dataclass(frozen=True)
class Stat:
    """Mean ± sample standard deviation over n seeds."""

    mean: float
    std: float
    n: int

    def __str__(self) -> str:
        return f"{self.mean:.2f} ± {self.std:.2f} ({self.n})"


def aggregate(values: Iterable[float | None]) -> Stat | None:
    """Mean ± std (n) of the values present; sample std (ddof=1) when n > 1, else 0."""
    xs = np.array([v for v in values if v is not None and not math.isnan(v)], dtype=float)
    if xs.size == 0:
        return None
    return Stat(float(xs.mean()), float(xs.std(ddof=1)) if xs.size > 1 else 0.0, int(xs.size))


def key(split: str, metric: str = "bleu") -> str:
    """The stats key of `metric` on `split` ("valid" or a test split)."""
    return PREFIX[metric] + split


def tok(split: str) -> str:
    """The stats key of a split's tokenized BLEU."""
    return key(split, "tokenized_bleu")


def bleu_stats(runs: list[Run], splits: list[str]) -> dict[str, Stat | None]:
    """Every metric of the final validation and of each test split over `runs`, by `key`."""
    return {key(s, m): aggregate(r.score(s, m) for r in runs) for m in METRICS for s in ("valid", *splits)}


def ordered_union(lists: Iterable[Iterable[str]]) -> list[str]:
    """Items in order of first appearance."""
    return list(dict.fromkeys(x for xs in lists for x in xs))


def seeds_of(runs: Iterable[Run]) -> list[int]:
    return sorted({r.seed for r in runs if r.seed is not None})


def default_k(runs: list[Run]) -> int | None:
    """The most common k among rel runs with a^K and a^V on (both runs if there is no such rel run).

    Ties are common (a k sweep with as many seeds per k as the shared rel run), so they go to
    the k most used by "both" runs, then to the paper's 16, then to the smallest k."""
    rel = Counter(r.k for r in runs if r.positions == "rel" and r.full_rel)
    both = Counter(r.k for r in runs if r.positions == "both" and r.full_rel)
    counts = rel or both
    if not counts:
        return None
    return max(counts, key=lambda k: (counts[k], both[k], k == PAPER_K, -k))


Rows = list[tuple[Hashable, list[Run], dict[str, Stat | None]]]


def grouped_rows(runs: list[Run], by: Callable[[Run], Hashable], order: Iterable[Hashable], splits: list[str]) -> Rows:
    """(key value, its runs, their stats) for each key value in `order` that has runs."""
    rows = []
    for value in order:
        members = [r for r in runs if by(r) == value]
        if members:
            rows.append((value, members, bleu_stats(members, splits)))
    return rows
