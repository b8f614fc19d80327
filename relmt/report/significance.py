"""Paired bootstrap tests between position strategies, seed by seed (Koehn 2004; sacreBLEU's paired-bs).

Seed s of the baseline is tested against seed s of the system on the same sentences: the
translations a run left in translations/<split>.<tgt> against the reference file <split>.<tgt> of
the --refs folder. Seeds are paired rather than pooled because a seed's training noise is part of
what the test should see once per pair, and the report counts how many pairs come out significant.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from relmt.evaluate.metrics import paired_bootstrap
from relmt.report.runs import Run, read_lines
from relmt.report.tables import Group, positions_runs

ALPHA = 0.05  # a seed pair is significant when p < ALPHA
# (baseline, system): the paper's Table 1 (rel against abs) and its combined setting (both against rel)
COMPARISONS = (("abs", "rel"), ("rel", "both"))
SEED = 12345  # sacreBLEU's default resampling seed, fixed so that a report is reproducible


@dataclass(frozen=True)
class PairTest:
    """One seed's paired bootstrap: sacreBLEU of both systems and the two-sided p-value."""

    seed: int
    baseline: float
    system: float
    p_value: float

    @property
    def difference(self) -> float:
        return self.system - self.baseline

    @property
    def significant(self) -> bool:
        return self.p_value < ALPHA


@dataclass
class Comparison:
    """`system` against `baseline` on one test set (or a subset of sentences), for every seed pair."""

    baseline: str
    system: str
    split: str
    tests: list[PairTest] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)  # why a seed could not be tested
    sentences: int | None = None

    def significant(self, direction: int = 0) -> int:
        """Seed pairs with p < ALPHA; with direction +1 (-1), only those where the system is ahead (behind)."""
        return sum(t.significant and (direction == 0 or t.difference * direction > 0) for t in self.tests)

    def mostly(self, direction: int) -> bool:
        """Significant in `direction` on more than half of the seed pairs tested."""
        return bool(self.tests) and 2 * self.significant(direction) > len(self.tests)


@functools.lru_cache(maxsize=64)
def lines(path: Path) -> tuple[str, ...]:
    """A file's lines, read once per report (every seed pair shares the references)."""
    return tuple(read_lines(path))


def reference_file(refs: Path, run: Run, split: str, lang: str | None = None) -> Path | None:
    """<split>.<lang> in `refs` (lang: the run's data.tgt), or the file under the corpus's own name
    of the split (data.splits)."""
    for name in dict.fromkeys((split, run.source_splits.get(split, split))):
        path = refs / f"{name}.{lang or run.tgt}"
        if path.is_file():
            return path
    return None


def by_seed(runs: list[Run], positions: str) -> dict[int, Run]:
    return {r.seed: r for r in runs if r.positions == positions and r.seed is not None}


def test_pairs(comparison: Comparison, base: dict[int, Run], system: dict[int, Run],
               texts: Callable[[Run], tuple[list[str], list[str]]], n_samples: int,
               keep: Callable[[int], bool] | None = None) -> None:
    """Fill `comparison` with a PairTest per seed both systems have. `texts(run)` gives a run's
    hypotheses and the references (OSError/ValueError: the reason it cannot); `keep(i)` picks sentences."""
    for seed in sorted(set(base) ^ set(system)):
        comparison.missing.append(f"seed {seed}: {comparison.baseline if seed in base else comparison.system} only")
    for seed in sorted(set(base) & set(system)):
        try:
            hyps_b, refs = texts(base[seed])
            hyps_s, _ = texts(system[seed])
            for run, hyps in ((base[seed], hyps_b), (system[seed], hyps_s)):
                if len(hyps) != len(refs):
                    raise ValueError(f"{run.path}: {len(hyps)} translations for {len(refs)} references")
            if keep is not None:
                index = [i for i in range(len(refs)) if keep(i)]
                hyps_b, hyps_s, refs = ([xs[i] for i in index] for xs in (hyps_b, hyps_s, refs))
            result = paired_bootstrap(hyps_b, hyps_s, refs, n_samples=n_samples, seed=SEED)
        except (OSError, ValueError) as exc:
            comparison.missing.append(f"seed {seed}: {exc}")
            continue
        comparison.sentences = len(refs)
        comparison.tests.append(PairTest(seed, result["baseline"], result["system"], result["p_value"]))


def split_texts(refs: Path, split: str) -> Callable[[Run], tuple[list[str], list[str]]]:
    """A run's translations of `split` and the reference file for it."""

    def texts(run: Run) -> tuple[list[str], list[str]]:
        hyps, ref = run.translations(split), reference_file(refs, run, split)
        if hyps is None or not hyps.is_file():
            raise OSError(f"no translations {hyps or 'file (data.tgt unknown)'}")
        if ref is None:
            raise OSError(f"no reference file {split}.{run.tgt} in {refs}")
        return read_lines(hyps), list(lines(ref))

    return texts


def compare_group(group: Group, refs: Path, n_samples: int) -> list[Comparison]:
    """rel against abs and both against rel on each test set of the positions comparison."""
    runs = positions_runs(group)
    out = []
    for baseline, system in COMPARISONS:
        base, other = by_seed(runs, baseline), by_seed(runs, system)
        if not base or not other:
            continue
        for split in group.splits:
            comparison = Comparison(baseline, system, split)
            test_pairs(comparison, base, other, split_texts(refs, split), n_samples)
            out.append(comparison)
    return out


def sources(refs: Path, run: Run, splits: list[str]) -> list[str]:
    """The source sentences of `splits` in order, from <split>.<src> in `refs`, as long as the references."""
    out: list[str] = []
    for split in splits:
        src, ref = reference_file(refs, run, split, run.src), reference_file(refs, run, split)
        if src is None or ref is None:
            raise OSError(f"no {split}.{run.src} and {split}.{run.tgt} in {refs}")
        if len(lines(src)) != len(lines(ref)):
            raise ValueError(f"{src} has {len(lines(src))} lines but {ref} has {len(lines(ref))}")
        out += lines(src)
    return out


def compare_unseen(runs: list[Run], refs: Path, max_words: int, n_samples: int) -> list[Comparison]:
    """rel against abs and both against rel on the test sentences whose source is longer than
    `max_words` (the splits of metrics.json's by_source_length pooled, as its buckets are)."""
    splits = list(dict.fromkeys(s for r in runs for s in r.length_splits))

    def texts(run: Run) -> tuple[list[str], list[str]]:
        pooled = [split_texts(refs, split)(run) for split in splits]
        return [h for hyps, _ in pooled for h in hyps], [r for _, refs_ in pooled for r in refs_]

    out = []
    for baseline, system in COMPARISONS:
        base, other = by_seed(runs, baseline), by_seed(runs, system)
        if not base or not other or not splits:
            continue
        comparison = Comparison(baseline, system, f"{' + '.join(splits)}, sources over {max_words} words")
        out.append(comparison)
        try:
            srcs = sources(refs, next(iter(base.values())), splits)
        except (OSError, ValueError) as exc:
            comparison.missing.append(str(exc))
            continue
        longer = {i for i, src in enumerate(srcs) if len(src.split()) > max_words}
        test_pairs(comparison, base, other, texts, n_samples, keep=longer.__contains__)
    return out
