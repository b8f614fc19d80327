"""The multi-seed paired test (relmt.evaluate.metrics.multi_seed_bootstrap; issue 59): one verdict from every
seed of two systems, counting the test sentences and the seeds (Clark et al. 2011), against the per-pair test."""

from __future__ import annotations

import numpy as np
import pytest

from relmt.evaluate.metrics import multi_seed_bootstrap, paired_bootstrap

N = 300


def corpus(seed: int = 0) -> list[str]:
    rng = np.random.default_rng(seed)
    words = [f"w{i}" for i in range(200)]
    return [" ".join(rng.choice(words, 10)) for _ in range(N)]


def run(refs: list[str], quality: float, seed: int) -> list[str]:
    """A seed's translations: the reference for a `quality` share of the sentences (which ones depends on the
    seed), half of its words replaced elsewhere."""
    rng = np.random.default_rng(1000 + seed)
    right = rng.random(len(refs)) < quality
    return [ref if ok else " ".join(w if j % 2 else "x" for j, w in enumerate(ref.split()))
            for ref, ok in zip(refs, right)]


def test_one_system_against_itself_differs_by_nothing():
    refs = corpus()
    runs = [run(refs, 0.6, s) for s in range(3)]
    r = multi_seed_bootstrap(runs, runs, refs, n_samples=200)
    assert r["difference"] == 0 and r["p_value"] == 1.0 and r["low"] <= 0 <= r["high"] and r["seeds"] == (3, 3)


def test_a_lucky_seed_pair_is_significant_alone_but_not_over_the_seeds():
    """The seeds spread the systems' BLEU as much as any difference: seed 1 of the baseline is its worst and seed 1
    of the system its best, so that pair alone calls a difference, while over the seeds the systems are level."""
    refs = corpus()
    base = [run(refs, q, s) for s, q in enumerate((0.3, 0.6, 0.9))]
    system = [run(refs, q, 10 + s) for s, q in enumerate((0.9, 0.6, 0.3))]
    pair = paired_bootstrap(base[0], system[0], refs, n_samples=500)
    assert pair["p_value"] < 0.05 and pair["low"] > 0
    multi = multi_seed_bootstrap(base, system, refs, n_samples=500)
    assert multi["p_value"] > 0.05 and multi["low"] < 0 < multi["high"]
    assert multi["baseline"] == pytest.approx(np.mean(multi["runs"][:3]))


def test_a_consistent_difference_over_the_seeds_is_found():
    refs = corpus(1)
    base = [run(refs, 0.45, s) for s in range(5)]
    system = [run(refs, 0.75, 20 + s) for s in range(4)]  # the systems need not have as many seeds
    r = multi_seed_bootstrap(base, system, refs, n_samples=500)
    assert r["difference"] > 0 and r["p_value"] < 0.05 and r["low"] > 0 and r["seeds"] == (5, 4)


def test_bad_input_is_refused():
    refs = corpus()
    with pytest.raises(ValueError, match="at least one seed"):
        multi_seed_bootstrap([], [refs], refs)
    with pytest.raises(ValueError, match="one hypothesis per reference"):
        multi_seed_bootstrap([refs[:-1]], [refs], refs)
