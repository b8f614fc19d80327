"""The paper's claims, each judged by the rules of relmt.report.verdicts on a group's paired tests. A claim
shows the means over seeds it is about; its verdict comes from the interval of the test over all seeds alone, so
without a paired test it is "not tested", whatever the means say."""

import math
from dataclasses import dataclass, field
from typing import Any

from relmt.report import paper
from relmt.report.significance import Comparison
from relmt.report.tables import LENGTH_SPLIT, Group
from relmt.report.verdicts import AHEAD, HELD, MARGIN, SLIGHT, Rule, combine, verdict, within

BOTH_WAYS = "(held), below 0 (did not hold), each by its 95% interval"  # a later method's claim, either way


@dataclass
class Claim:
    name: str
    table: str
    criterion: str
    measured: dict[str, float]
    verdict: str
    split: str | None = None
    test: str | None = None  # the tests' differences, intervals and p, in words
    paper: str | None = None  # what the paper found, for data sets it has no numbers for
    held: bool = field(init=False)

    def __post_init__(self) -> None:
        self.held = self.verdict == HELD


def mean_of(table: dict | None, split: str, **match: Any) -> float | None:
    """Mean BLEU on `split` of the table row whose fields equal `match`, or None."""
    row = next((r for r in (table or {}).get("rows", []) if all(r.get(k) == v for k, v in match.items())), None)
    return row["bleu"][split].mean if row and row["bleu"].get(split) else None


def judged(name: str, table: str, split: str | None, measured: dict[str, float], criterion: str,
           tests: list[tuple[Comparison | None, Rule]], note: str | None) -> Claim:
    """The claim with its verdict: each comparison judged by its rule on its test over all seeds, then combined;
    that test and the seed pairs beside it in words."""
    said = [f"{c.system} − {c.baseline} over all seeds ({c.overall.seeds[0]} + {c.overall.seeds[1]}) "
            f"{c.overall.difference:+.2f} [{c.overall.low:+.2f}, {c.overall.high:+.2f}] p = {c.overall.p_value:.3f}"
            + (f", per seed pair (decides nothing; {c.significant()} of {len(c.tests)} significant): " + ", ".join(
                f"seed {t.seed} {t.difference:+.2f} [{t.low:+.2f}, {t.high:+.2f}] p = {t.p_value:.3f}"
                for t in c.tests) if c.tests else "") for c, _ in tests if c and c.overall]
    return Claim(name, table, criterion, measured, combine([verdict(c.overall if c else None, r) for c, r in tests]),
                 split, "; ".join(said) or None, note)


def check(group: Group, split: str, name: str, table: str, rows: dict[str, float | None], criterion: str,
          tests: list[tuple[str, str, Rule]], finding: str | None, measured: dict[str, float] | None = None
          ) -> Claim | None:
    """A claim about the table rows `rows` (label: mean; None when the row is missing) on `split`, judged
    on the comparisons (baseline, system, rule); `finding` is shown for data sets without the paper's numbers."""
    if any(v is None for v in rows.values()):
        return None
    found = [(next((c for c in group.significance if (c.baseline, c.system, c.split) == (b, s, split)), None), rule)
             for b, s, rule in tests]
    note = finding if group.numbers == paper.PaperNumbers.differences else None
    return judged(name, table, split, {**rows, **(measured or {})}, criterion, found, note)


def ahead(group: Group, split: str, name: str, table: str, note: str | None, system: str = "rel",
          baseline: str = "abs", how: str = "(the 95% interval excludes 0 on rel's side)") -> Claim | None:
    """system ≥ baseline (Table 1's rel against abs, or a later method's): significantly ahead over all seeds."""
    means = {p: mean_of(group.tables["positions"], split, positions=p) for p in (system, baseline)}
    return check(group, split, name, table, means, f"{system} − {baseline} on {split} above 0 {how}",
                 [(baseline, system, AHEAD)], note)


def table1(group: Group, split: str) -> list[Claim | None]:
    both, rel = (mean_of(group.tables["positions"], split, positions=p) for p in ("both", "rel"))
    gain = {"both − rel": both - rel} if both is not None and rel is not None else {}
    return [ahead(group, split, "rel ≥ abs", "Table 1", paper.TABLE1_DIFFERENCES),
            check(group, split, "both gives no further gain over rel", "Table 1", {"both": both, "rel": rel},
                  f"both − rel on {split} below +{MARGIN:g}", [("rel", "both", within(-math.inf, MARGIN))],
                  paper.BOTH_FINDING, gain)]


def table2(group: Group, split: str) -> list[Claim | None]:
    kd, ks = group.k_default, group.tables["k"]
    means = {r["k"]: mean_of(ks, split, k=r["k"]) for r in (ks or {}).get("rows", []) if r["k"] >= 2}
    means = {k: m for k, m in means.items() if m is not None}
    k0, kdef = mean_of(ks, split, k=0), mean_of(ks, split, k=kd)
    collapse = check(group, split, "k = 0 collapses", "Table 2", {"k=0": k0, f"k={kd}": kdef},
                     f"BLEU(k={kd}) − BLEU(k=0) on {split} above 0.5 × BLEU(k={kd}) (k = 0 below half of it)",
                     [("k=0", f"k={kd}", Rule(lambda t: (0.5 * t.system, math.inf)))], paper.TABLE2_FINDING,
                     {f"0.5 × k={kd}": 0.5 * kdef} if kdef is not None else {}) if kd != 0 else None
    if len(means) < 2 or kd not in means:
        return [collapse, None]
    return [collapse, check(group, split, "k ≥ 2 saturates", "Table 2", {f"k={k}": m for k, m in means.items()},
                            f"BLEU(k) − BLEU(k={kd}) on {split} within ±{MARGIN:g} for every k ≥ 2 "
                            f"(k = {', '.join(str(k) for k in means)})",
                            [(f"k={kd}", f"k={k}", within(-MARGIN, MARGIN)) for k in means if k != kd],
                            paper.TABLE2_FINDING, {"spread": max(means.values()) - min(means.values())})]


def table3(group: Group, split: str) -> list[Claim | None]:
    full, keys, values = (mean_of(group.tables["kv"], split, relative_keys=k, relative_values=v)
                          for k, v in ((True, True), (True, False), (False, True)))
    both = "a^K and a^V"
    return [check(group, split, "a^K alone is about as good as both", "Table 3", {"a^K only": keys, both: full},
                  f"BLEU(a^K yes, a^V no) − BLEU(a^K yes, a^V yes) on {split} within ±{MARGIN:g}",
                  [(both, "a^K only", within(-MARGIN, MARGIN))], paper.TABLE3_FINDING,
                  {"|difference|": abs(keys - full)} if None not in (keys, full) else {}),
            check(group, split, "a^V alone is slightly lower than both", "Table 3", {"a^V only": values, both: full},
                  f"BLEU(a^K yes, a^V yes) − BLEU(a^K no, a^V yes) on {split} above 0 and below {SLIGHT:g}",
                  [("a^V only", both, within(0.0, SLIGHT))], paper.TABLE3_FINDING,
                  {"gap": full - values} if None not in (values, full) else {})]


def beyond(group: Group, split: str) -> list[Claim | None]:
    """Beyond the paper (issue 31): each of rope, alibi and t5 against abs and against Shaw's rel, both ways."""
    return [ahead(group, split, f"{method} ≥ {baseline}", "beyond the paper", None, method, baseline, BOTH_WAYS)
            for method in paper.BEYOND for baseline in ("abs", "rel")]


def check_claims(group: Group) -> list[Claim]:
    """Every claim the group's tables allow, each on every test set in turn, then the long-sentence claim."""
    splits, claims = [s for s in group.splits if s != LENGTH_SPLIT], []  # the long-sentence split: a claim of its own
    for table in (table1, table2, table3, beyond):  # each claim on every test set, then the next claim
        claims += [claim for per_split in zip(*(table(group, split) for split in splits)) for claim in per_split]
    if LENGTH_SPLIT in group.splits:
        claims.append(ahead(group, LENGTH_SPLIT, "rel beats abs on longer sentences than seen in training",
                            "Table 1, test_long", None))
    return [c for c in claims if c is not None]
