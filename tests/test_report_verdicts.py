"""The verdict rules (relmt/report/verdicts.py): every verdict is reachable from the interval of the test over all
seeds, and the two directions are treated alike (issue 29 §1)."""

from __future__ import annotations

import random

from relmt.report.significance import PairTest
from relmt.report.verdicts import (
    AHEAD,
    HELD,
    INCONCLUSIVE,
    MARGIN,
    NOT_HELD,
    NOT_SIGNIFICANT,
    NOT_TESTED,
    combine,
    verdict,
    within,
)


def pair(seed: int | None, difference: float, half: float, p: float | None = None) -> PairTest:
    """A test (of all seeds: seed None) with the difference, an interval of ± half around it, and p (small iff 0
    is outside)."""
    low, high = difference - half, difference + half
    return PairTest(seed, 30.0, 30.0 + difference, low, high, p if p is not None else (0.01 if low > 0 or high < 0
                                                                                    else 0.4))


def swapped(t: PairTest) -> PairTest:
    return PairTest(t.seed, t.system, t.baseline, -t.high, -t.low, t.p_value)


def test_directional_claims_reach_every_verdict():
    assert verdict(pair(None, 2.0, 1.0), AHEAD) == HELD
    assert verdict(pair(None, -2.0, 1.0), AHEAD) == NOT_HELD
    assert verdict(pair(None, 0.2, 1.0), AHEAD) == NOT_SIGNIFICANT
    assert verdict(None, AHEAD) == NOT_TESTED


def test_the_old_asymmetry_is_gone():
    """At p = 0.4, rel 30.01 against abs 30.00 and rel 30.00 against abs 30.01 are both not significant (the means
    used to make the second one "did not hold")."""
    for difference in (0.01, -0.01):
        assert verdict(pair(None, difference, 1.0), AHEAD) == NOT_SIGNIFICANT


def test_equivalence_claims_reach_every_verdict():
    equivalent = within(-MARGIN, MARGIN)
    assert verdict(pair(None, 0.1, 0.5), equivalent) == HELD
    assert verdict(pair(None, 3.0, 0.5), equivalent) == NOT_HELD
    assert verdict(pair(None, -3.0, 0.5), equivalent) == NOT_HELD  # outside on either side
    assert verdict(pair(None, 0.16, 0.9), equivalent) == INCONCLUSIVE  # a small gap with a wide interval
    assert verdict(None, equivalent) == NOT_TESTED


def test_swapping_the_systems_flips_directional_and_keeps_equivalence_verdicts():
    rng = random.Random(0)
    flip = {HELD: NOT_HELD, NOT_HELD: HELD, NOT_SIGNIFICANT: NOT_SIGNIFICANT}
    seen = set()
    for _ in range(300):
        test = pair(None, rng.uniform(-3, 3), rng.uniform(0, 2))
        v = verdict(test, AHEAD)
        seen.add(v)
        assert verdict(swapped(test), AHEAD) == flip[v]
        equivalent = within(-MARGIN, MARGIN)
        assert verdict(swapped(test), equivalent) == verdict(test, equivalent)
    assert seen == {HELD, NOT_HELD, NOT_SIGNIFICANT}


def test_a_claim_of_several_comparisons_fails_if_any_fails_and_holds_only_if_all_hold():
    assert combine([HELD, HELD]) == HELD
    assert combine([HELD, NOT_HELD, INCONCLUSIVE]) == NOT_HELD
    assert combine([HELD, INCONCLUSIVE]) == INCONCLUSIVE
    assert combine([HELD, NOT_TESTED]) == NOT_TESTED
    assert combine([]) == NOT_TESTED


def test_the_test_over_all_seeds_decides_and_the_seed_pairs_counts_do_not():
    """Issue 59: three seed pairs each too noisy alone but all one way are held by the test over all seeds; three
    lucky pairs whose seeds' test crosses 0 are not."""
    from relmt.report.claims import judged
    from relmt.report.significance import Comparison

    quiet = Comparison("abs", "rel", "test", tests=[pair(s, 0.6, 0.8) for s in (1, 2, 3)], overall=pair(None, 0.6, 0.4))
    loud = Comparison("abs", "rel", "test", tests=[pair(s, 1.5, 1.0) for s in (1, 2, 3)], overall=pair(None, 1.5, 2.0))
    assert (quiet.significant(), loud.significant()) == (0, 3)
    claims = [judged("rel ≥ abs", "Table 1", "test", {}, "above 0", [(c, AHEAD)], None) for c in (quiet, loud)]
    assert [c.verdict for c in claims] == [HELD, NOT_SIGNIFICANT]
    assert "over all seeds (1 + 1) +0.60 [+0.20, +1.00]" in claims[0].test and "0 of 3 significant" in claims[0].test
