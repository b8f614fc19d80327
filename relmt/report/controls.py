"""Controlled experiments: the runs outside Tables 1-3, each beside the configurations it differs from
in one setting (issue 12 §4, the toy findings explained).

Tables 1-3 compare configurations trained alike. A run that changes something else tests a hypothesis
about them instead: trained for more updates than most runs of its group, with parameters frozen at
their initial values (train.freeze), or `both` with a^K or a^V switched off. Such a run is a
*variant*, and it stays out of Tables 1-3. Its *controls* are the configurations of the group that
differ from it in exactly one setting (positions, k, a^K, a^V, updates, frozen parameters), so each
difference measures one change. Each variant is compared with each control on the means over seeds,
and seed by seed with the paired bootstrap when the report has the references.

The report also gives every configuration's validation BLEU at the first validation and at the end:
whether a short run's ranking survives training to convergence.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, fields
from pathlib import Path

from relmt.report.aggregate import Stat, aggregate, bleu_stats, seeds_of
from relmt.report.runs import Run
from relmt.report.significance import Comparison, split_texts, test_pairs
from relmt.report.text import DASH, fmt, md_table, plural

NO_POSITION_FLAGS = ("abs", "none")  # k, a^K and a^V change nothing without relative positions
SETTING_NAMES = {"positions": "positions", "k": "k", "keys": "a^K", "values": "a^V", "updates": "updates",
                 "frozen": "frozen parameters"}
POSITIONS_ORDER = ("abs", "rel", "both", "none")


@dataclass(frozen=True)
class Setting:
    """What a run's configuration changes among the settings Tables 1-3 and their controls vary."""

    positions: str
    k: int | None
    keys: bool | None
    values: bool | None
    updates: int | None
    frozen: tuple[str, ...]

    @classmethod
    def of(cls, run: Run) -> Setting:
        if run.positions in NO_POSITION_FLAGS:
            return cls(run.positions, None, None, None, run.updates, run.frozen)
        return cls(run.positions, run.k, run.keys, run.values, run.updates, run.frozen)

    def differs_in(self, other: Setting) -> list[str]:
        """The names (SETTING_NAMES) of the settings in which the two differ."""
        return [SETTING_NAMES[f.name] for f in fields(self) if getattr(self, f.name) != getattr(other, f.name)]

    def order(self) -> tuple:
        """Table order: by positions, then k, with a^K and a^V on first, then training length."""
        kind = POSITIONS_ORDER.index(self.positions) if self.positions in POSITIONS_ORDER else len(POSITIONS_ORDER)
        return (kind, self.k or 0, not self.keys, not self.values, self.updates or 0, self.frozen)

    def label(self, k_default: int | None, updates: int | None) -> str:
        """e.g. "rel, a^K only, 16000 updates": what differs from the group's usual run, in words."""
        parts = [self.positions]
        if self.k is not None and self.k != k_default:
            parts.append(f"k = {self.k}")
        if self.keys is not None and not (self.keys and self.values):
            parts.append("a^K only" if self.keys else "a^V only" if self.values else "neither a^K nor a^V")
        if self.updates != updates:
            parts.append(f"{self.updates} updates")
        if self.frozen:
            parts.append("frozen " + ", ".join(f"`{p}`" for p in self.frozen))
        return ", ".join(parts)


def usual_updates(runs: list[Run]) -> int | None:
    """The number of updates most runs of a group trained for (ties: the fewest)."""
    counts = Counter(r.updates for r in runs)
    return max(counts, key=lambda u: (counts[u], -(u or 0))) if counts else None


def is_variant(run: Run, updates: int | None) -> bool:
    """Outside Tables 1-3: another training length, frozen parameters, or `both` without a^K or a^V
    (Table 3 switches them for rel only)."""
    return bool(run.frozen) or run.updates != updates or (run.positions == "both" and not run.full_rel)


def split_variants(runs: list[Run]) -> tuple[list[Run], list[Run]]:
    """(the runs of Tables 1-3, the variants)."""
    updates = usual_updates(runs)
    return [r for r in runs if not is_variant(r, updates)], [r for r in runs if is_variant(r, updates)]


def configurations(runs: list[Run]) -> dict[Setting, list[Run]]:
    """The runs of each setting, in table order (Setting.order)."""
    out: dict[Setting, list[Run]] = {}
    for run in runs:
        out.setdefault(Setting.of(run), []).append(run)
    return dict(sorted(out.items(), key=lambda item: item[0].order()))


def first_validation(runs: list[Run]) -> int | None:
    """The first update every run with a learning curve validated at."""
    common = None
    for run in runs:
        if run.curve:
            steps = {step for step, _ in run.curve}
            common = steps if common is None else common & steps
    return min(common) if common else None


def curve_at(run: Run, step: int) -> float | None:
    return next((bleu for s, bleu in run.curve if s == step), None)


def by_seed(runs: list[Run]) -> dict[int, Run]:
    return {r.seed: r for r in runs if r.seed is not None}


def controls_table(runs: list[Run], variants: list[Run], splits: list[str], k_default: int | None,
                   refs: Path | None, n_samples: int) -> dict | None:
    """Each variant configuration with its controls (the configurations one setting away) and the
    paired tests against each; None without variants."""
    if not variants:
        return None
    updates = usual_updates(runs + variants)
    every = configurations(runs + variants)
    rows = []
    for setting, members in configurations(variants).items():
        label = setting.label(k_default, updates)
        controls = []
        for other, control_runs in every.items():
            differs = setting.differs_in(other)
            if len(differs) != 1:
                continue
            tests = []
            for split in splits if refs is not None else []:
                comparison = Comparison(other.label(k_default, updates), label, split)
                test_pairs(comparison, by_seed(control_runs), by_seed(members), split_texts(refs, split), n_samples)
                tests.append(comparison)
            controls.append({"label": other.label(k_default, updates), "differs_in": differs[0],
                             "seeds": seeds_of(control_runs), "bleu": bleu_stats(control_runs, splits),
                             "tests": tests})
        rows.append({"label": label, "setting": setting, "seeds": seeds_of(members),
                     "bleu": bleu_stats(members, splits), "controls": controls})
    return {"updates": updates, "splits": splits, "rows": rows}


FLAT_SHARE = 0.2  # issue 12: converged = valid BLEU flat over the last 20% of updates
FLAT_RANGE = 1.0  # our threshold for "flat": max - min of valid BLEU over that stretch, in BLEU


def tail_range(run: Run) -> float | None:
    """max − min of the run's validation BLEU over its last FLAT_SHARE of updates (at least two
    validations there), else None."""
    if not run.curve:
        return None
    last = max(step for step, _ in run.curve)
    tail = [bleu for step, bleu in run.curve if step >= (1 - FLAT_SHARE) * last]
    return max(tail) - min(tail) if len(tail) >= 2 else None


def stages_table(runs: list[Run], k_default: int | None) -> dict | None:
    """Every configuration's validation BLEU at the first validation every run of the usual length has
    (– for a run without it) and at the end,
    and whether its runs converged: valid BLEU flat (range ≤ FLAT_RANGE) over the last FLAT_SHARE."""
    updates = usual_updates(runs)
    # the runs of the usual length decide the update (a run trained longer may validate less often)
    first = first_validation([r for r in runs if r.updates == updates])
    if first is None:
        return None
    rows = []
    for setting, members in configurations(runs).items():
        ranges = [tail_range(r) for r in members]
        known = [x for x in ranges if x is not None]
        rows.append({"label": setting.label(k_default, updates), "seeds": seeds_of(members),
                     "first": aggregate(curve_at(r, first) for r in members),
                     "final": aggregate(r.score("valid") for r in members),
                     "tail_range": max(known) if known else None,
                     "flat": all(x <= FLAT_RANGE for x in known) if known else None})
    return {"first_update": first, "updates": updates, "flat_share": FLAT_SHARE, "flat_range": FLAT_RANGE,
            "rows": rows}


def difference(a: Stat | None, b: Stat | None) -> str:
    return f"{a.mean - b.mean:+.2f}" if a is not None and b is not None else DASH


def md_tests(tests: list[Comparison]) -> str:
    """'test: 2 of 3 seed pairs significant (2 ahead, 0 behind)' per split, or why none was tested."""
    parts = []
    for c in tests:
        if c.tests:
            parts.append(f"{c.split}: {c.significant()} of {plural(len(c.tests), 'seed pair')} significant "
                         f"({c.significant(+1)} ahead, {c.significant(-1)} behind)")
        else:
            parts.append(f"{c.split}: not tested ({'; '.join(c.missing) or 'no seed in common'})")
    return "; ".join(parts)


def md_controls(table: dict | None) -> str | None:
    if not table:
        return None
    splits = ["valid", *table["splits"]]
    parts = ["### Controlled experiments: the runs outside Tables 1-3",
             f"Each configuration below changes something Tables 1-3 keep fixed (most runs here trained for "
             f"{table['updates']} updates). It is set beside each configuration that differs from it in exactly "
             "one setting, so each difference measures one change (relmt/report/controls.py). sacreBLEU, mean ± "
             "std (n seeds); the difference is the variant's mean minus the control's. Where the report has the "
             "references, seed s of the variant is tested against seed s of the control with sacreBLEU's paired "
             "bootstrap (p < 0.05)."]
    for row in table["rows"]:
        header = ["configuration", "differs in", *(f"{s} sacreBLEU" for s in splits)]
        lines = [[f"**{row['label']}**", DASH, *(fmt(row["bleu"].get(s)) for s in splits)]]
        for c in row["controls"]:
            lines.append([c["label"], c["differs_in"], *(fmt(c["bleu"].get(s)) for s in splits)])
            lines.append([f"difference (variant − {c['label']})", "", *(difference(row["bleu"].get(s), c["bleu"].get(s))
                                                                       for s in splits)])
        text = f"**{row['label']}** (seeds {', '.join(map(str, row['seeds'])) or DASH})\n\n{md_table(header, lines)}"
        if not row["controls"]:
            text += "\n\nNo configuration of this group differs from it in one setting only."
        tested = [f"- against {c['label']}: {md_tests(c['tests'])}" for c in row["controls"] if c["tests"]]
        if tested:
            text += "\n\nPaired bootstrap, variant against control:\n\n" + "\n".join(tested)
        parts.append(text)
    return "\n\n".join(parts)


def md_stages(table: dict | None) -> str | None:
    if not table:
        return None
    first, share = table["first_update"], round(100 * table["flat_share"])
    rows = [[r["label"], ", ".join(map(str, r["seeds"])) or DASH, fmt(r["first"]), fmt(r["final"]),
             difference(r["final"], r["first"]), DASH if r["tail_range"] is None else f"{r['tail_range']:.2f}",
             {True: "yes", False: "**no**", None: DASH}[r["flat"]]] for r in table["rows"]]
    return ("### Validation BLEU at the first validation and at the end, every configuration\n\n"
            f"Whether a short run's ranking survives training to convergence: each configuration's validation "
            f"sacreBLEU after {first} updates (the first validation every run has) and after its last update, "
            f"mean ± std (n seeds). Converged means valid BLEU flat over the last {share}% of the updates: its "
            f"range there (max − min, the largest over seeds) at most {table['flat_range']:.1f} BLEU, our "
            "threshold.\n\n"
            + md_table(["configuration", "seeds", f"valid at update {first}", "valid at the end", "gain",
                        f"range over the last {share}%", "flat"], rows))
