"""The paper's claims, checked on a group's tables and, where it has them, its paired bootstrap tests.

Each claim is first judged on the mean over seeds with the criterion it states. A claim about the
difference between two position strategies of Table 1 is then judged again by the paired bootstrap
on that test set, when the report has translations and references (see VERDICTS).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from relmt.report import paper
from relmt.report.significance import ALPHA, Comparison
from relmt.report.tables import LENGTH_SPLIT, Group

HELD, NOT_HELD, NOT_SIGNIFICANT = "held", "did not hold", "not significant"
EPS = 1e-9  # float slack for the "≤" criteria, so that e.g. 25.8 - 25.3 counts as 0.5
THRESHOLDS_NOTE = ("The thresholds in these criteria are our own choice for judging noisy small-scale runs, "
                   "not the paper's.")
VERDICTS = (
    f"Verdicts. Every claim is first judged on the mean over seeds, by the criterion it states. A claim "
    f"about two position strategies of Table 1 (rel against abs, both against rel) is then tested seed by "
    f"seed when the report has each run's translations and the references: seed s of one strategy "
    f"against seed s of the other, with sacreBLEU's paired bootstrap (1000 resamples unless stated), and "
    f"a seed pair counts as significant when p < {ALPHA} and its difference points the same way as the "
    f"means'. **held**: the criterion holds on the means and, for a claim that one strategy is better "
    f"(rel ≥ abs), that difference is significant on more than half of the seed pairs. **not "
    f"significant**: the means point the way the verdict would go, but the difference that decides it is "
    f"significant on at most half of the seed pairs; for rel ≥ abs, rel is ahead on the means but not "
    f"significantly; for \"both gives no further gain\", both is more than 0.5 BLEU ahead on the means "
    f"but not significantly, so the gain the claim denies is not established. **did not hold**: the "
    f"criterion fails on the means (rel behind abs), or the gain that a claim denies is beyond its "
    f"threshold and significant on more than half of the seed pairs. Claims without a paired test (the k "
    f"and a^K/a^V ablations, and every claim when the report was built without --refs) are judged on the "
    f"means alone: held or did not hold.")


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
    if table is None or key is None:
        return None
    for row in table["rows"]:
        if all(row.get(k) == v for k, v in match.items()):
            stat = row["bleu"].get(key)
            return stat.mean if stat else None
    return None


def comparison(group: Group, baseline: str, system: str, split: str) -> Comparison | None:
    """The group's paired tests of `system` against `baseline` on `split`, if any seed pair was tested."""
    return next((c for c in group.significance if (c.baseline, c.system, c.split) == (baseline, system, split)
                 and c.tests), None)


def describe(c: Comparison) -> str:
    """The paired bootstrap's outcome in words, with every seed pair's p-value."""
    ahead = c.significant(+1)
    behind = c.significant(-1)
    ps = ", ".join(f"seed {t.seed} p = {t.p_value:.3f}" for t in c.tests)
    return (f"{c.system} against {c.baseline}, {c.system} significantly ahead on {ahead} and behind on {behind} "
            f"of {len(c.tests)} seed pairs ({ps})")


def better(name: str, table: str, group: Group, split: str, system: str, baseline: str, note: str | None,
           strict: bool = False) -> Claim | None:
    """`system` ≥ (`strict`: >) `baseline` on the means, confirmed by the paired bootstrap when there is one."""
    s, b = (mean_of(group.tables["positions"], split, positions=p) for p in (system, baseline))
    if s is None or b is None:
        return None
    c = comparison(group, baseline, system, split)
    ahead = s > b if strict else s >= b - EPS
    verdict = NOT_HELD if not ahead else HELD if c is None or c.mostly(+1) else NOT_SIGNIFICANT
    criterion = f"mean BLEU({system}) {'>' if strict else '≥'} mean BLEU({baseline}) on {split}"
    if c is not None:
        criterion += f", and {system} significantly ahead on more than half of the seed pairs"
    return Claim(name, table, criterion, {system: s, baseline: b}, verdict, split, describe(c) if c else None, note)


def claim_rel_ge_abs(group: Group, split: str) -> Claim | None:
    note = paper.TABLE1_DIFFERENCES if group.numbers == paper.PaperNumbers.differences else None
    return better("rel ≥ abs", "Table 1", group, split, "rel", "abs", note)


def claim_long_sentences(group: Group, split: str) -> Claim | None:
    return better("rel beats abs on longer sentences than seen in training", "Table 1, test_long", group, split,
                  "rel", "abs", None, strict=True)


def claim_both_no_gain(group: Group, split: str) -> Claim | None:
    both, rel = (mean_of(group.tables["positions"], split, positions=p) for p in ("both", "rel"))
    if both is None or rel is None:
        return None
    c = comparison(group, "rel", "both", split)
    gain = both - rel
    verdict = HELD if gain <= 0.5 + EPS else NOT_SIGNIFICANT if c is not None and not c.mostly(+1) else NOT_HELD
    criterion = f"BLEU(both) − BLEU(rel) ≤ 0.5 on {split}"
    if c is not None:
        criterion += ", or a larger gain that is significant on at most half of the seed pairs (not significant)"
    return Claim("both gives no further gain over rel", "Table 1", criterion,
                 {"both": both, "rel": rel, "both − rel": gain}, verdict, split, describe(c) if c else None,
                 paper.BOTH_FINDING if group.numbers == paper.PaperNumbers.differences else None)


def claim_k0_collapses(group: Group, split: str) -> Claim | None:
    kd = group.k_default
    k0, kdef = (mean_of(group.tables["k"], split, k=k) for k in (0, kd))
    if k0 is None or kdef is None or kd == 0:
        return None
    return Claim("k = 0 collapses", "Table 2", f"BLEU(k=0) < 0.5 × BLEU(k={kd}) on {split}",
                 {"k=0": k0, f"k={kd}": kdef, f"0.5 × k={kd}": 0.5 * kdef}, HELD if k0 < 0.5 * kdef else NOT_HELD,
                 split, paper=finding(group, paper.TABLE2_FINDING))


def claim_k_saturates(group: Group, split: str) -> Claim | None:
    table = group.tables["k"]
    if table is None:
        return None
    means = {row["k"]: mean_of(table, split, k=row["k"]) for row in table["rows"] if row["k"] >= 2}
    means = {k: m for k, m in means.items() if m is not None}
    if len(means) < 2:
        return None
    spread = max(means.values()) - min(means.values())
    ks = ", ".join(str(k) for k in means)
    return Claim("k ≥ 2 saturates", "Table 2", f"max − min of mean BLEU over k ≥ 2 (k = {ks}) ≤ 1.5 on {split}",
                 {**{f"k={k}": m for k, m in means.items()}, "spread": spread},
                 HELD if spread <= 1.5 + EPS else NOT_HELD, split, paper=finding(group, paper.TABLE2_FINDING))


def kv_pair(group: Group, split: str, keys: bool, values: bool) -> tuple[float, float] | None:
    """Mean BLEU of the (a^K, a^V) = (keys, values) row and of the full (yes, yes) row of Table 3."""
    table = group.tables["kv"]
    part = mean_of(table, split, relative_keys=keys, relative_values=values)
    full = mean_of(table, split, relative_keys=True, relative_values=True)
    return None if part is None or full is None else (part, full)


def claim_keys_alone(group: Group, split: str) -> Claim | None:
    if (pair := kv_pair(group, split, keys=True, values=False)) is None:
        return None
    keys_only, full = pair
    diff = abs(keys_only - full)
    return Claim("a^K alone is about as good as both", "Table 3",
                 f"|BLEU(a^K yes, a^V no) − BLEU(a^K yes, a^V yes)| ≤ 1.0 on {split}",
                 {"a^K only": keys_only, "a^K and a^V": full, "|difference|": diff},
                 HELD if diff <= 1.0 + EPS else NOT_HELD, split, paper=finding(group, paper.TABLE3_FINDING))


def claim_values_lower(group: Group, split: str) -> Claim | None:
    if (pair := kv_pair(group, split, keys=False, values=True)) is None:
        return None
    values_only, full = pair
    gap = full - values_only
    return Claim("a^V alone is slightly lower than both", "Table 3",
                 f"0 < BLEU(a^K yes, a^V yes) − BLEU(a^K no, a^V yes) ≤ 2.0 on {split}",
                 {"a^V only": values_only, "a^K and a^V": full, "gap": gap},
                 HELD if EPS < gap <= 2.0 + EPS else NOT_HELD, split, paper=finding(group, paper.TABLE3_FINDING))


def finding(group: Group, text: str) -> str | None:
    return text if group.numbers == paper.PaperNumbers.differences else None


PER_SPLIT: tuple[Callable[[Group, str], Claim | None], ...] = (
    claim_rel_ge_abs, claim_both_no_gain, claim_k0_collapses, claim_k_saturates, claim_keys_alone, claim_values_lower)


def check_claims(group: Group) -> list[Claim]:
    """Every claim the group's tables allow, each on every test set in turn, then the long-sentence claim."""
    claims = [check(group, split) for check in PER_SPLIT for split in group.claim_splits]
    if LENGTH_SPLIT in group.splits:
        claims.append(claim_long_sentences(group, LENGTH_SPLIT))
    return [c for c in claims if c is not None]
