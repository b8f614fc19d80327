"""Controlled experiments (issue 12 §4): each run outside Tables 1-3 (a *variant*) beside its *controls*, the
configurations one setting away, so that each difference measures one change; and every configuration's valid BLEU
at the first validation and at the end: whether a short run's ranking survives training to convergence."""

from collections import Counter
from dataclasses import dataclass, fields

from relmt.report.aggregate import DASH, Stat, aggregate, bleu_stats, fmt, md_table, plural, seeds_of
from relmt.report.paper import POSITIONS, TABLELESS
from relmt.report.runs import Run
from relmt.report.significance import Comparison, by_seed, split_texts, test_pairs
from relmt.report.tables import Group

SETTING_NAMES = {"positions": "positions", "k": "k", "keys": "a^K", "values": "a^V", "updates": "updates",
                 "frozen": "frozen parameters"}
KV_LABELS = {(True, False): "a^K only", (False, True): "a^V only", (False, False): "neither a^K nor a^V"}
FLAT_SHARE = 0.2  # issue 12: converged = valid BLEU flat over the last 20% of updates
FLAT_RANGE = 1.0  # our threshold for "flat": max - min of valid BLEU over that stretch, in BLEU


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
    def of(cls, run: Run) -> "Setting":
        if run.positions in TABLELESS:  # k, a^K and a^V change nothing without Shaw's tables
            return cls(run.positions, None, None, None, run.updates, run.frozen)
        return cls(run.positions, run.k, run.keys, run.values, run.updates, run.frozen)

    def differs_in(self, other: "Setting") -> list[str]:
        return [SETTING_NAMES[f.name] for f in fields(self) if getattr(self, f.name) != getattr(other, f.name)]

    def order(self) -> tuple:
        """Table order: by positions, then k, with a^K and a^V on first, then training length."""
        kind = POSITIONS.index(self.positions) if self.positions in POSITIONS else len(POSITIONS)
        return (kind, self.k or 0, not self.keys, not self.values, self.updates or 0, self.frozen)

    def label(self, k_default: int | None, updates: int | None) -> str:
        """e.g. "rel, a^K only, 16000 updates": what differs from the group's usual run, in words."""
        return ", ".join(filter(None, [
            self.positions, f"k = {self.k}" if self.k not in (None, k_default) else "",
            KV_LABELS.get((self.keys, self.values), ""), f"{self.updates} updates" if self.updates != updates else "",
            "frozen " + ", ".join(f"`{p}`" for p in self.frozen) if self.frozen else ""]))


def usual_updates(runs: list[Run]) -> int | None:
    """The number of updates most runs of a group trained for (ties: the fewest)."""
    counts = Counter(r.updates for r in runs)
    return max(counts, key=lambda u: (counts[u], -(u or 0))) if counts else None


def split_variants(runs: list[Run]) -> tuple[list[Run], list[Run]]:
    """(the runs of Tables 1-3, the variants: another training length, frozen parameters, or `both` without a^K or
    a^V, which Table 3 switches for rel only)."""
    updates = usual_updates(runs)
    variant = [bool(r.frozen) or r.updates != updates or (r.positions == "both" and not r.full_rel) for r in runs]
    return [r for r, v in zip(runs, variant) if not v], [r for r, v in zip(runs, variant) if v]


def configurations(runs: list[Run]) -> dict[Setting, list[Run]]:
    out: dict[Setting, list[Run]] = {}
    for run in runs:
        out.setdefault(Setting.of(run), []).append(run)
    return dict(sorted(out.items(), key=lambda item: item[0].order()))


def controls_table(group: Group) -> dict | None:
    """Each variant configuration with its controls and the paired tests against each; None without variants."""
    if not group.variants:
        return None
    splits, refs, every = group.splits, group.refs, group.runs + group.variants
    updates, configs, rows = usual_updates(every), configurations(every), []
    names = {setting: setting.label(group.k_default, updates) for setting in configs}
    for setting, members in configurations(group.variants).items():
        controls = [{"label": names[other], "differs_in": differs[0], "seeds": seeds_of(control_runs),
                     "bleu": bleu_stats(control_runs, splits),
                     "tests": [test_pairs(Comparison(names[other], names[setting], split), by_seed(control_runs),
                                          by_seed(members), split_texts(refs, [split]), group.n_samples)
                               for split in (splits if refs is not None else [])]}
                    for other, control_runs in configs.items() if len(differs := setting.differs_in(other)) == 1]
        rows.append({"label": names[setting], "setting": setting, "seeds": seeds_of(members),
                     "bleu": bleu_stats(members, splits), "controls": controls})
    return {"updates": updates, "splits": splits, "rows": rows}


def tail_range(run: Run) -> float | None:
    """max − min of the run's valid BLEU over its last FLAT_SHARE of updates (at least two validations), else None."""
    last = max((step for step, _ in run.curve), default=0)
    tail = [bleu for step, bleu in run.curve if step >= (1 - FLAT_SHARE) * last]
    return max(tail) - min(tail) if len(tail) >= 2 else None


def stages_table(runs: list[Run], k_default: int | None) -> dict | None:
    """Every configuration's valid BLEU at the first update all runs of the usual length validated at (a longer run
    may validate less often) and at the end, and whether its runs converged (tail_range ≤ FLAT_RANGE)."""
    updates = usual_updates(runs)
    steps = [{step for step, _ in r.curve} for r in runs if r.updates == updates and r.curve]
    if not steps or not (common := set.intersection(*steps)):
        return None
    first, rows = min(common), []
    for setting, members in configurations(runs).items():
        known = [x for x in map(tail_range, members) if x is not None]
        rows.append({"label": setting.label(k_default, updates), "seeds": seeds_of(members),
                     "first": aggregate(next((b for s, b in r.curve if s == first), None) for r in members),
                     "final": aggregate(r.score("valid") for r in members), "tail_range": max(known, default=None),
                     "flat": all(x <= FLAT_RANGE for x in known) if known else None})
    return {"first_update": first, "updates": updates, "flat_share": FLAT_SHARE, "flat_range": FLAT_RANGE,
            "rows": rows}


def difference(a: Stat | None, b: Stat | None) -> str:
    return f"{a.mean - b.mean:+.2f}" if a is not None and b is not None else DASH


def md_tests(tests: list[Comparison]) -> str:
    """'test: all seeds (3 + 3) +0.52 [-0.10, +1.13] p = 0.094; 2 of 3 seed pairs significant (2 ahead, 0 behind)'
    per split, or why none was tested."""
    return "; ".join(f"{c.split}: all seeds ({t.seeds[0]} + {t.seeds[1]}) {t.difference:+.2f} [{t.low:+.2f}, "
                     f"{t.high:+.2f}] p = {t.p_value:.3f}; {c.significant()} of {plural(len(c.tests), 'seed pair')} "
                     f"significant ({c.significant(+1)} ahead, {c.significant(-1)} behind)" if (t := c.overall) else
                     f"{c.split}: not tested ({'; '.join(c.missing) or 'no seed in common'})" for c in tests)


def md_controls(table: dict | None) -> str | None:
    if not table:
        return None
    splits = ["valid", *table["splits"]]
    parts = ["### Controlled experiments: the runs outside Tables 1-3",
             f"Each configuration below changes something Tables 1-3 keep fixed (most runs here trained for "
             f"{table['updates']} updates). It is set beside each configuration that differs from it in exactly one "
             "setting, so each difference measures one change (relmt/report/controls.py). sacreBLEU, mean ± std (n "
             "seeds); the difference is the variant's mean minus the control's. Where the report has the references, "
             "the variant is tested against the control over all seeds at once (sentences and seeds resampled, "
             "Clark et al. 2011), and seed s against seed s with the paired bootstrap (two-sided p < 0.05)."]
    for row in table["rows"]:
        lines = [[f"**{row['label']}**", DASH, *(fmt(row["bleu"].get(s)) for s in splits)]]
        for c in row["controls"]:
            lines += [[c["label"], c["differs_in"], *(fmt(c["bleu"].get(s)) for s in splits)],
                      [f"difference (variant − {c['label']})", "",
                       *(difference(row["bleu"].get(s), c["bleu"].get(s)) for s in splits)]]
        header = ["configuration", "differs in", *(f"{s} sacreBLEU" for s in splits)]
        text = f"**{row['label']}** (seeds {', '.join(map(str, row['seeds'])) or DASH})\n\n{md_table(header, lines)}"
        if not row["controls"]:
            text += "\n\nNo configuration of this group differs from it in one setting only."
        if tested := [f"- against {c['label']}: {md_tests(c['tests'])}" for c in row["controls"] if c["tests"]]:
            text += "\n\nPaired tests, variant against control:\n\n" + "\n".join(tested)
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
            f"sacreBLEU after {first} updates (the first validation every run has) and after its last update, mean ± "
            f"std (n seeds). Converged means valid BLEU flat over the last {share}% of the updates: its range there "
            f"(max − min, the largest over seeds) at most {table['flat_range']:.1f} BLEU, our threshold.\n\n"
            + md_table(["configuration", "seeds", f"valid at update {first}", "valid at the end", "gain",
                        f"range over the last {share}%", "flat"], rows))
