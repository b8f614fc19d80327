"""Paired tests (relmt.evaluate.metrics) of each run's translations/<split>.<tgt> against <split>.<tgt> of the refs=
folder. One test counts every seed of both systems at once (`multi_seed_bootstrap`, Clark et al. 2011: it resamples
the sentences and each system's seeds) and decides the verdicts; beside it, seed s of the baseline against seed s of
the system (`paired_bootstrap`), whose counts of significant pairs are shown but decide nothing: on same-system
pairs they call a difference 10% of the time at alpha 0.05 (docs/results/reproduction/calibration.md)."""

import functools
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from relmt.data.sources import read_lines
from relmt.errors import UserError
from relmt.evaluate.metrics import multi_seed_bootstrap, paired_bootstrap
from relmt.report.paper import BEYOND
from relmt.report.runs import Run
from relmt.report.tables import Group, positions_runs

ALPHA = 0.05  # a seed pair is significant when p < ALPHA, i.e. its 95% interval excludes 0
SEED = 12345  # the resampling seed, fixed so that a report is reproducible
Texts = Callable[[Run], tuple[list[str], list[str]]]
# later methods (issue 31) against abs and against Shaw's rel: (baseline, system)
BEYOND_PAIRS = [(baseline, method) for method in BEYOND for baseline in ("abs", "rel")]


@dataclass(frozen=True)
class PairTest:
    """One seed pair (`seed`), or every seed at once (seed None; `seeds`: how many each system has, and the
    scores are means over them): both systems' sacreBLEU, the 95% interval of system − baseline, the two-sided p."""

    seed: int | None
    baseline: float
    system: float
    low: float
    high: float
    p_value: float
    seeds: tuple[int, int] = (1, 1)

    @property
    def difference(self) -> float:
        return self.system - self.baseline


@dataclass
class Comparison:
    """`system` against `baseline` on one test set (or a subset of its sentences), every seed pair."""

    baseline: str
    system: str
    split: str
    tests: list[PairTest] = field(default_factory=list)
    overall: PairTest | None = None  # every seed at once: the test that decides verdicts
    missing: list[str] = field(default_factory=list)  # why a seed could not be tested
    sentences: int | None = None

    def significant(self, direction: int = 0) -> int:
        """Seed pairs with p < ALPHA; direction +1 (-1): only those where the system is ahead (behind)."""
        return sum(t.p_value < ALPHA and (direction == 0 or t.difference * direction > 0) for t in self.tests)


@functools.lru_cache(maxsize=256)
def lines(path: Path) -> tuple[str, ...]:
    """A text file's lines, split on "\\n" only, read once per report (every seed pair shares the references)."""
    try:
        return tuple(read_lines(path))
    except UserError as exc:  # invalid UTF-8 or a NUL: the pair is listed as not tested, with the reason
        raise ValueError(str(exc)) from None


def reference_file(refs: Path, run: Run, split: str, lang: str | None = None) -> Path | None:
    """<split>.<lang> in `refs` (lang: the run's data.tgt), or under the corpus's own name of the split."""
    for name in dict.fromkeys((split, run.source_splits.get(split, split))):
        if (path := refs / f"{name}.{lang or run.tgt}").is_file():
            return path
    return None


def by_seed(runs: list[Run]) -> dict[int, Run]:
    return {r.seed: r for r in runs if r.seed is not None}


def test_pairs(comparison: Comparison, base: dict[int, Run], system: dict[int, Run], texts: Texts,
               n_samples: int, keep: Callable[[int], bool] | None = None) -> Comparison:
    """Fill `comparison` with a PairTest per seed both sides have, and `overall` with the test over every seed
    each side could read (a seed without a partner counts there too). `texts(run)` gives a run's hypotheses and
    the references (OSError/ValueError: why it cannot); `keep(i)` picks sentences."""
    read: list[dict[int, list[str]]] = [{}, {}]
    refs: list[str] = []
    for side, own, other, hyps in ((comparison.baseline, base, system, read[0]), (comparison.system, system, base,
                                                                                   read[1])):
        if alone := sorted(set(own) - set(other)):
            comparison.missing.append(f"seed{'s' * (len(alone) > 1)} {', '.join(map(str, alone))}: {side} only "
                                      "(no pair; counted in the test over all seeds)")
        for seed, run in own.items():
            try:
                got, ref_lines = texts(run)
                if len(got) != len(ref_lines):
                    raise ValueError(f"{run.path}: {len(got)} translations for {len(ref_lines)} references")
            except (OSError, ValueError) as exc:
                comparison.missing.append(f"seed {seed}: {exc}")
                continue
            hyps[seed], refs = got, ref_lines
    if keep is not None:
        index = [i for i in range(len(refs)) if keep(i)]
        refs, read = [refs[i] for i in index], [{s: [h[i] for i in index] for s, h in r.items()} for r in read]
    if not read[0] or not read[1] or not refs:
        comparison.missing += ["no sentences to test"] if read[0] and read[1] else []
        return comparison
    comparison.sentences = len(refs)
    for seed in sorted(set(read[0]) & set(read[1])):
        r = paired_bootstrap(read[0][seed], read[1][seed], refs, n_samples=n_samples, seed=SEED, alpha=ALPHA)
        comparison.tests.append(PairTest(seed, r["baseline"], r["system"], r["low"], r["high"], r["p_value"]))
    m = multi_seed_bootstrap(*([r[s] for s in sorted(r)] for r in read), refs, n_samples, SEED, ALPHA)
    comparison.overall = PairTest(None, m["baseline"], m["system"], m["low"], m["high"], m["p_value"], m["seeds"])
    return comparison


def split_texts(refs: Path, splits: list[str]) -> Texts:
    """A run's translations of `splits`, pooled in order, and the reference files for them."""
    def texts(run: Run) -> tuple[list[str], list[str]]:
        hyps, ref_lines = [], []
        for split in splits:
            path, ref = run.translations(split), reference_file(refs, run, split)
            if path is None or not path.is_file():
                raise OSError(f"no translations {path or 'file (data.tgt unknown)'}")
            if ref is None:
                raise OSError(f"no reference file {split}.{run.tgt} in {refs}")
            hyps, ref_lines = hyps + list(lines(path)), ref_lines + list(lines(ref))
        return hyps, ref_lines
    return texts


def arms(group: Group) -> list[tuple[str, list[Run], str, list[Run]]]:
    """(baseline, its runs, system, its runs) for each comparison a claim needs: Table 1's rel against abs
    and both against rel, Table 2's default k against k = 0 and each other k against the default, Table
    3's a^K alone against both tables and both tables against a^V alone, and the later methods'."""
    pos, kd = positions_runs(group), group.k_default
    rel = [r for r in group.runs if r.positions == "rel"]
    at = {p: [r for r in pos if r.positions == p] for p in ("abs", "rel", "both", *BEYOND)}
    out = [(b, at[b], s, at[s]) for b, s in (("abs", "rel"), ("rel", "both"))]
    for k in sorted({row["k"] for row in (group.tables.get("k") or {}).get("rows", [])} - {kd}):
        k_runs = [r for r in rel if r.full_rel and r.k == k]
        out.append(("k=0", k_runs, f"k={kd}", at["rel"]) if k == 0 else (f"k={kd}", at["rel"], f"k={k}", k_runs))
    kv = [r for r in rel if r.k == kd]
    keys, values = ([r for r in kv if (r.keys, r.values) == flags] for flags in ((True, False), (False, True)))
    out += [("a^K and a^V", at["rel"], "a^K only", keys), ("a^V only", values, "a^K and a^V", at["rel"])]
    out += [(b, at[b], s, at[s]) for b, s in BEYOND_PAIRS]
    return [arm for arm in out if arm[1] and arm[3]]


def compare_group(group: Group) -> list[Comparison]:
    return [test_pairs(Comparison(b, s, split), by_seed(b_runs), by_seed(s_runs), split_texts(group.refs, [split]),
                       group.n_samples) for b, b_runs, s, s_runs in arms(group) for split in group.splits]


def compare_unseen(runs: list[Run], refs: Path, max_words: int, n_samples: int) -> list[Comparison]:
    """rel against abs, both against rel and BEYOND_PAIRS on the test sentences whose source is longer than
    `max_words` (the splits of metrics.json's by_source_length pooled, as its buckets are)."""
    splits, out = list(dict.fromkeys(s for r in runs for s in r.length_splits)), []
    for baseline, system in [("abs", "rel"), ("rel", "both"), *BEYOND_PAIRS]:
        base, other = (by_seed([r for r in runs if r.positions == p]) for p in (baseline, system))
        if not base or not other or not splits:
            continue
        out.append(comparison := Comparison(baseline, system, f"{' + '.join(splits)}, sources over {max_words} words"))
        try:  # the sources, in order, as long as the references
            run, srcs = next(iter(base.values())), []
            for split in splits:
                src, ref = reference_file(refs, run, split, run.src), reference_file(refs, run, split)
                if src is None or ref is None:
                    raise OSError(f"no {split}.{run.src} and {split}.{run.tgt} in {refs}")
                if len(lines(src)) != len(lines(ref)):
                    raise ValueError(f"{src} has {len(lines(src))} lines but {ref} has {len(lines(ref))}")
                srcs += lines(src)
        except (OSError, ValueError) as exc:
            comparison.missing.append(str(exc))
            continue
        longer = {i for i, src in enumerate(srcs) if len(src.split()) > max_words}
        test_pairs(comparison, base, other, split_texts(refs, splits), n_samples, keep=longer.__contains__)
    return out
