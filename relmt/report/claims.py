"""The paper's claims, each judged by the rules of relmt.report.verdicts on a group's paired tests.

A claim shows the means over seeds it is about, and its verdict comes from the seed pairs' intervals
alone: without a paired test it is "not tested", whatever the means say.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from relmt.report import paper
from relmt.report.significance import Comparison
from relmt.report.tables import LENGTH_SPLIT, Group
from relmt.report.verdicts import HELD, MARGIN, SLIGHT, Rule, combine, verdict


@dataclass
class Claim:
    """One of the paper's claims checked against a group's runs."""

    name: str
    table: str
    criterion: str
    measured: dict[str, float]
    verdict: str
    split: str | None = None
    test: str | None = None  # the paired bootstrap's outcome, in words
    paper: str | None = None  # what the paper found, for data sets it has no numbers for
    held: bool = field(init=False)

    def __post_init__(self) -> None:
        self.held = self.verdict == HELD


def mean_of(table: dict | None, key: str | None, **match: Any) -> float | None:
    """Mean of stats `key` in the table row whose fields equal `match`, or None."""
    for row in (table or {}).get("rows", []) if key else []:
        if all(row.get(k) == v for k, v in match.items()):
            return row["bleu"][key].mean if row["bleu"].get(key) else None
    return None


def describe(c: Comparison) -> str:
    """Every seed pair's difference, interval and p, in words."""
    pairs = ", ".join(f"seed {t.seed} {t.difference:+.2f} [{t.low:+.2f}, {t.high:+.2f}] p = {t.p_value:.3f}"
                      for t in c.tests)
    return f"{c.system} − {c.baseline} per seed pair with its 95% interval: {pairs}"


def judged(name: str, table: str, split: str | None, measured: dict[str, float], criterion: str,
           tests: list[tuple[Comparison | None, Rule]], note: str | None) -> Claim:
    """The claim with its verdict: each comparison judged by its rule, then combined."""
    verdicts = [verdict(c.tests if c else [], rule) for c, rule in tests]
    return Claim(name, table, criterion, measured, combine(verdicts), split,
                 "; ".join(describe(c) for c, _ in tests if c and c.tests) or None, note)


def comparison(group: Group, baseline: str, system: str, split: str) -> Comparison | None:
    return next((c for c in group.significance if (c.baseline, c.system, c.split) == (baseline, system, split)), None)


def differences(group: Group) -> bool:
    return group.numbers == paper.PaperNumbers.differences


def ahead(name: str, table: str, group: Group, split: str, system: str, baseline: str,
          note: str | None) -> Claim | None:
    """`system` ≥ `baseline`: significantly ahead on most seed pairs."""
    s, b = (mean_of(group.tables["positions"], split, positions=p) for p in (system, baseline))
    if s is None or b is None:
        return None
    return judged(name, table, split, {system: s, baseline: b},
                  f"{system} − {baseline} on {split} above 0 (the 95% interval excludes 0 on {system}'s side)",
                  [(comparison(group, baseline, system, split), Rule.ahead())], note)


def claim_rel_ge_abs(group: Group, split: str) -> Claim | None:
    return ahead("rel ≥ abs", "Table 1", group, split, "rel", "abs",
                 paper.TABLE1_DIFFERENCES if differences(group) else None)


def claim_long_sentences(group: Group, split: str) -> Claim | None:
    return ahead("rel beats abs on longer sentences than seen in training", "Table 1, test_long", group, split,
                 "rel", "abs", None)


def claim_both_no_gain(group: Group, split: str) -> Claim | None:
    both, rel = (mean_of(group.tables["positions"], split, positions=p) for p in ("both", "rel"))
    if both is None or rel is None:
        return None
    return judged("both gives no further gain over rel", "Table 1", split,
                  {"both": both, "rel": rel, "both − rel": both - rel}, f"both − rel on {split} below +{MARGIN:g}",
                  [(comparison(group, "rel", "both", split), Rule.within(-math.inf, MARGIN))],
                  paper.BOTH_FINDING if differences(group) else None)


def claim_k0_collapses(group: Group, split: str) -> Claim | None:
    kd = group.k_default
    k0, kdef = (mean_of(group.tables["k"], split, k=k) for k in (0, kd))
    if k0 is None or kdef is None or kd == 0:
        return None
    rule = Rule(lambda t: (0.5 * t.system, math.inf))
    return judged("k = 0 collapses", "Table 2", split, {"k=0": k0, f"k={kd}": kdef, f"0.5 × k={kd}": 0.5 * kdef},
                  f"BLEU(k={kd}) − BLEU(k=0) on {split} above 0.5 × BLEU(k={kd}) (k = 0 below half of it)",
                  [(comparison(group, "k=0", f"k={kd}", split), rule)], finding(group, paper.TABLE2_FINDING))


def claim_k_saturates(group: Group, split: str) -> Claim | None:
    kd, table = group.k_default, group.tables["k"]
    means = {row["k"]: mean_of(table, split, k=row["k"]) for row in (table or {}).get("rows", []) if row["k"] >= 2}
    means = {k: m for k, m in means.items() if m is not None}
    if len(means) < 2 or kd not in means:
        return None
    within = Rule.within(-MARGIN, MARGIN)
    return judged("k ≥ 2 saturates", "Table 2", split,
                  {**{f"k={k}": m for k, m in means.items()}, "spread": max(means.values()) - min(means.values())},
                  f"BLEU(k) − BLEU(k={kd}) on {split} within ±{MARGIN:g} for every k ≥ 2 "
                  f"(k = {', '.join(str(k) for k in means)})",
                  [(comparison(group, f"k={kd}", f"k={k}", split), within) for k in means if k != kd],
                  finding(group, paper.TABLE2_FINDING))


def kv_pair(group: Group, split: str, keys: bool, values: bool) -> tuple[float, float] | None:
    """Mean BLEU of the (a^K, a^V) = (keys, values) row and of the full (yes, yes) row of Table 3."""
    part, full = (mean_of(group.tables["kv"], split, relative_keys=k, relative_values=v)
                  for k, v in ((keys, values), (True, True)))
    return None if part is None or full is None else (part, full)


def claim_keys_alone(group: Group, split: str) -> Claim | None:
    if (pair := kv_pair(group, split, keys=True, values=False)) is None:
        return None
    keys_only, full = pair
    return judged("a^K alone is about as good as both", "Table 3", split,
                  {"a^K only": keys_only, "a^K and a^V": full, "|difference|": abs(keys_only - full)},
                  f"BLEU(a^K yes, a^V no) − BLEU(a^K yes, a^V yes) on {split} within ±{MARGIN:g}",
                  [(comparison(group, "a^K and a^V", "a^K only", split), Rule.within(-MARGIN, MARGIN))],
                  finding(group, paper.TABLE3_FINDING))


def claim_values_lower(group: Group, split: str) -> Claim | None:
    if (pair := kv_pair(group, split, keys=False, values=True)) is None:
        return None
    values_only, full = pair
    return judged("a^V alone is slightly lower than both", "Table 3", split,
                  {"a^V only": values_only, "a^K and a^V": full, "gap": full - values_only},
                  f"BLEU(a^K yes, a^V yes) − BLEU(a^K no, a^V yes) on {split} above 0 and below {SLIGHT:g}",
                  [(comparison(group, "a^V only", "a^K and a^V", split), Rule.within(0.0, SLIGHT))],
                  finding(group, paper.TABLE3_FINDING))


def finding(group: Group, text: str) -> str | None:
    return text if differences(group) else None


PER_SPLIT: tuple[Callable[[Group, str], Claim | None], ...] = (
    claim_rel_ge_abs, claim_both_no_gain, claim_k0_collapses, claim_k_saturates, claim_keys_alone, claim_values_lower)


def check_claims(group: Group) -> list[Claim]:
    """Every claim the group's tables allow, each on every test set in turn, then the long-sentence claim."""
    claims = [check(group, split) for check in PER_SPLIT for split in group.claim_splits]
    if LENGTH_SPLIT in group.splits:
        claims.append(claim_long_sentences(group, LENGTH_SPLIT))
    return [c for c in claims if c is not None]
