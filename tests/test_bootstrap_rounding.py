"""paired_bootstrap's promise, p < alpha exactly when the interval excludes 0, holds for every alpha and
n_samples, float rounding included (issue 42 §4). 0.07 * 200 / 2 is 7.000000000000001 in floats, and an
interval read at the ceil() of it gave p = 0.070 with an interval excluding 0."""

from __future__ import annotations

import random
from collections.abc import Callable

import numpy as np
import pytest

from relmt.evaluate.metrics import paired_bootstrap, percentile_test


def synthetic_systems(n: int = 40, seed: int = 3) -> tuple[list[str], Callable[[float], list[str]]]:
    """References of random words, and a maker of systems that keep each reference word with probability
    q (else a random word); the draws come one after another from one seeded stream."""
    rng = random.Random(seed)
    words = [f"w{i}" for i in range(40)]
    refs = [[rng.choice(words) for _ in range(rng.randint(5, 15))] for _ in range(n)]

    def system(q: float) -> list[str]:
        return [" ".join(w if rng.random() < q else rng.choice(words) for w in ref) for ref in refs]
    return [" ".join(ref) for ref in refs], system


def excludes_zero(result: dict) -> bool:
    return result["low"] > 0 or result["high"] < 0


def test_alpha_0_07_with_200_samples_agrees_on_the_boundary():
    refs, system = synthetic_systems()
    baseline = system(0.6)
    on_boundary = 0
    for trial in range(40):  # the system improves with the trial, so p sweeps from about 1 to 0
        r = paired_bootstrap(baseline, system(0.6 + trial / 200), refs, n_samples=200, seed=trial, alpha=0.07)
        assert (r["p_value"] < 0.07) == excludes_zero(r), r
        on_boundary += r["p_value"] == 2 * 7 / 200
    assert on_boundary, "no trial had 7 resamples on the rarer side: the case the rounding broke is untested"


@pytest.mark.parametrize(("alpha", "n_samples"), [(0.07, 400), (0.14, 100), (0.28, 300), (0.55, 200), (0.56, 100),
                                                  (0.05, 1000), (0.1, 300), (0.01, 200), (0.025, 400)])
def test_p_below_alpha_exactly_when_the_interval_excludes_zero(alpha: float, n_samples: int):
    refs, system = synthetic_systems(25, seed=int(alpha * 1000) + n_samples)
    baseline = system(0.6)
    for trial in range(8):
        r = paired_bootstrap(baseline, system(0.6 + trial / 50), refs, n_samples=n_samples, seed=trial, alpha=alpha)
        assert (r["p_value"] < alpha) == excludes_zero(r), r


@pytest.mark.parametrize("n_samples", [100, 200, 300, 400, 1000])
def test_the_decision_and_the_interval_share_one_count_for_every_alpha(n_samples: int):
    """Differences with t resamples below 0, z at 0 and the rest above (or mirrored), for every alpha in
    0.01..0.99 and 0.001, 0.025, and every t near the boundary alpha N / 2."""
    for alpha in [a / 100 for a in range(1, 100)] + [0.001, 0.025]:
        edge = round(alpha * n_samples / 2)
        for t in sorted({0, *range(max(edge - 2, 0), edge + 3), n_samples // 2}):
            for zeros in (0, 1):
                signs = [-1.0] * t + [0.0] * zeros + [1.0] * (n_samples - t - zeros)
                for diffs in (np.array(signs), -np.array(signs[::-1])):
                    p, low, high = percentile_test(diffs, alpha)
                    assert p == min(1.0, 2 * min(t + zeros, n_samples - t) / n_samples)  # the rarer side
                    assert (p < alpha) == (low > 0 or high < 0), (alpha, n_samples, t, zeros, p, low, high)
