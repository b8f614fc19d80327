#!/usr/bin/env python
"""How often does each significance test call a difference between a system and itself? (issue 59)

A system is the committed runs that share every setting but the seed (relmt.report.runs.Run.settings). For
each system with at least two seeds and each test split, every split of its seeds into two groups is a
comparison of a system with itself, on which a test at alpha = 0.05 should call a difference about 5% of the
time:
- the per-pair test (relmt.evaluate.metrics.paired_bootstrap): each pair of two different seeds;
- the multi-seed test (multi_seed_bootstrap): each split of the seeds into two non-empty groups (the two
  groups of a split, swapped, are one comparison).
The page gives, per test, the comparisons counted, how many called a difference, the rate and its 95%
Clopper-Pearson interval.

The references are the corpus's own files (default ../shared/data/multi30k, this project's machines'
copy; pass --refs for another): the committed runs carry their translations, not the references.

    python scripts/reproduce/calibrate_tests.py --out docs/results/reproduction/calibration.json \\
        --md docs/results/reproduction/calibration.md
"""

from __future__ import annotations

import argparse
import itertools
import math
from collections import defaultdict
from pathlib import Path

from relmt.bench import command_line, hardware, markdown_table, write_json
from relmt.evaluate.metrics import multi_seed_bootstrap, paired_bootstrap
from relmt.report.runs import find_run_dirs, read_runs
from relmt.report.significance import ALPHA, SEED, lines, reference_file

ROOT = Path(__file__).resolve().parents[2]
RUNS = ["docs/results/reproduction/multi30k/runs", "docs/results/reproduction/multi30k_anchor/runs",
        "docs/results/positions/runs"]


def binomial_cdf(k: int, n: int, p: float) -> float:
    return sum(math.comb(n, i) * p ** i * (1 - p) ** (n - i) for i in range(k + 1))


def clopper_pearson(k: int, n: int, level: float = 0.95) -> tuple[float, float]:
    """The exact 95% interval of a rate k / n: the p at which seeing k or more (k or fewer) has probability
    (1 - level) / 2, found by bisection on the binomial distribution."""
    tail = (1 - level) / 2

    def solve(f, lo: float = 0.0, hi: float = 1.0) -> float:
        for _ in range(60):  # f falls as p grows
            mid = (lo + hi) / 2
            lo, hi = (mid, hi) if f(mid) > 0 else (lo, mid)
        return (lo + hi) / 2

    low = 0.0 if k == 0 else solve(lambda p: tail - (1 - binomial_cdf(k - 1, n, p)))
    high = 1.0 if k == n else solve(lambda p: binomial_cdf(k, n, p) - tail)
    return low, high


def splits_of(n: int) -> list[tuple[tuple[int, ...], tuple[int, ...]]]:
    """Every split of seeds 0..n-1 into two non-empty groups, each split once (the group holding seed 0 first)."""
    out = []
    for size in range(1, n):
        for group in itertools.combinations(range(n), size):
            if 0 in group:
                out.append((group, tuple(i for i in range(n) if i not in group)))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("runs", nargs="*", default=[str(ROOT / r) for r in RUNS])
    ap.add_argument("--refs", type=Path, default=ROOT.parent / "shared/data/multi30k")
    ap.add_argument("--n-samples", type=int, default=1000)
    ap.add_argument("--out", default="")
    ap.add_argument("--md", default="")
    args = ap.parse_args()

    runs, skipped = read_runs(find_run_dirs(args.runs))
    systems = defaultdict(list)
    for run in runs:
        if run.seed is not None:
            systems[run.settings].append(run)
    rows, calls = [], {"per-pair": [0, 0], "multi-seed": [0, 0]}
    for system in systems.values():
        system.sort(key=lambda r: r.seed)
        if len(system) < 2:
            continue
        name = f"{system[0].path.parent.parent.name}/{system[0].path.name.rsplit('_s', 1)[0]}"
        for split in system[0].test:
            ref = reference_file(args.refs, system[0], split)
            paths = [r.translations(split) for r in system]
            if ref is None or any(p is None or not p.is_file() for p in paths):
                continue
            refs, hyps = list(lines(ref)), [list(lines(p)) for p in paths]
            if any(len(h) != len(refs) for h in hyps):
                continue
            for i, j in itertools.combinations(range(len(system)), 2):
                r = paired_bootstrap(hyps[i], hyps[j], refs, n_samples=args.n_samples, seed=SEED, alpha=ALPHA)
                calls["per-pair"][0] += 1
                calls["per-pair"][1] += r["p_value"] < ALPHA
                rows.append({"system": name, "split": split, "test": "per-pair",
                             "groups": f"s{system[i].seed} vs s{system[j].seed}", "difference": r["difference"],
                             "p_value": r["p_value"]})
            for a, b in splits_of(len(system)):
                r = multi_seed_bootstrap([hyps[i] for i in a], [hyps[i] for i in b], refs, n_samples=args.n_samples,
                                         seed=SEED, alpha=ALPHA)
                calls["multi-seed"][0] += 1
                calls["multi-seed"][1] += r["p_value"] < ALPHA
                rows.append({"system": name, "split": split, "test": "multi-seed",
                             "groups": " + ".join(f"s{system[i].seed}" for i in a) + " vs " +
                             " + ".join(f"s{system[i].seed}" for i in b), "difference": r["difference"],
                             "p_value": r["p_value"]})
            print(f"{name} {split}: {len(system)} seeds", flush=True)
    summary = []
    for test, (n, k) in calls.items():
        low, high = clopper_pearson(k, n) if n else (float("nan"), float("nan"))
        summary.append({"test": test, "comparisons": n, "called": k, "rate": k / n if n else float("nan"),
                        "low": low, "high": high})
    table = markdown_table(summary, [("test", "test"), ("comparisons", "same-system comparisons"),
                                     ("called", f"p < {ALPHA}"), ("rate", "false-positive rate"),
                                     ("low", "95% interval, low"), ("high", "high")])
    detail = markdown_table(rows, [("system", "system"), ("split", "split"), ("test", "test"), ("groups", "seeds"),
                                   ("difference", "difference (BLEU)"), ("p_value", "p")])
    print(table)
    hw = hardware()
    payload = {"command": command_line(), "hardware": hw, "alpha": ALPHA, "n_samples": args.n_samples,
               "summary": summary, "comparisons": rows, "skipped": [str(p) for p, _ in skipped]}
    if args.out:
        write_json(args.out, payload)
    if args.md:
        Path(args.md).write_text(
            "# Calibration: each significance test on a system against itself\n\n"
            f"`{command_line()}`\n\n{hw['date']}; {hw['cpu']}.\n\n"
            "A system is the committed runs that share every setting but the seed; each split of its seeds into two "
            "groups compares the system with itself, so a calibrated test at alpha = 0.05 calls a difference in "
            "about 5% of them. The per-pair test compares two seeds (paired bootstrap over the test sentences); "
            "the multi-seed test compares the two groups' mean sacreBLEU, resampling the sentences and each "
            "group's seeds (docs/reproducing.md, how a verdict is decided). Comparisons on one system share "
            "runs, so they are not independent, and the intervals (Clopper-Pearson) are optimistic.\n\n"
            f"{table}\n\n## Every comparison\n\n{detail}\n")


if __name__ == "__main__":
    main()
