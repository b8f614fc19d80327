"""The verdict rules (relmt/report/verdicts.py): every verdict is reachable, and the two directions are
treated alike (issue 29 §1)."""

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


def pair(seed: int, difference: float, half: float, p: float | None = None) -> PairTest:
    """A seed pair with the difference, an interval of ± half around it, and p (small iff 0 is outside)."""
    low, high = difference - half, difference + half
    return PairTest(seed, 30.0, 30.0 + difference, low, high, p if p is not None else (0.01 if low > 0 or high < 0
                                                                                    else 0.4))


def swapped(t: PairTest) -> PairTest:
    return PairTest(t.seed, t.system, t.baseline, -t.high, -t.low, t.p_value)


def test_directional_claims_reach_every_verdict():
    ahead = AHEAD
    assert verdict([pair(1, 2.0, 1.0), pair(2, 1.5, 1.0), pair(3, 0.2, 1.0)], ahead) == HELD
    assert verdict([pair(1, -2.0, 1.0), pair(2, -1.5, 1.0), pair(3, 0.2, 1.0)], ahead) == NOT_HELD
    assert verdict([pair(1, 2.0, 1.0), pair(2, 0.2, 1.0), pair(3, -0.2, 1.0)], ahead) == NOT_SIGNIFICANT
    assert verdict([pair(1, 2.0, 1.0), pair(2, -2.0, 1.0)], ahead) == NOT_SIGNIFICANT  # one each way: no majority
    assert verdict([], ahead) == NOT_TESTED


def test_the_old_asymmetry_is_gone():
    """Every seed pair at p = 0.4: rel 30.01 against abs 30.00 and rel 30.00 against abs 30.01 are both
    not significant (the means used to make the second one "did not hold")."""
    for difference in (0.01, -0.01):
        assert verdict([pair(s, difference, 1.0) for s in (1, 2, 3)], AHEAD) == NOT_SIGNIFICANT


def test_equivalence_claims_reach_every_verdict():
    equivalent = within(-MARGIN, MARGIN)
    assert verdict([pair(1, 0.1, 0.5), pair(2, -0.2, 0.5)], equivalent) == HELD
    assert verdict([pair(1, 3.0, 0.5), pair(2, -3.0, 0.5)], equivalent) == NOT_HELD  # outside on either side
    assert verdict([pair(1, 0.1, 2.0), pair(2, 0.1, 0.5)], equivalent) == INCONCLUSIVE  # one wide interval: no majority
    assert verdict([pair(1, 0.16, 0.9)], equivalent) == INCONCLUSIVE  # a small gap with a wide interval decides nothing
    assert verdict([], equivalent) == NOT_TESTED


def test_swapping_the_systems_flips_directional_and_keeps_equivalence_verdicts():
    rng = random.Random(0)
    flip = {HELD: NOT_HELD, NOT_HELD: HELD, NOT_SIGNIFICANT: NOT_SIGNIFICANT}
    seen = set()
    for _ in range(300):
        tests = [pair(s, rng.uniform(-3, 3), rng.uniform(0, 2)) for s in range(rng.randint(1, 4))]
        back = [swapped(t) for t in tests]
        v = verdict(tests, AHEAD)
        seen.add(v)
        assert verdict(back, AHEAD) == flip[v]
        equivalent = within(-MARGIN, MARGIN)
        assert verdict(back, equivalent) == verdict(tests, equivalent)
    assert seen == {HELD, NOT_HELD, NOT_SIGNIFICANT}


def test_a_claim_of_several_comparisons_fails_if_any_fails_and_holds_only_if_all_hold():
    assert combine([HELD, HELD]) == HELD
    assert combine([HELD, NOT_HELD, INCONCLUSIVE]) == NOT_HELD
    assert combine([HELD, INCONCLUSIVE]) == INCONCLUSIVE
    assert combine([HELD, NOT_TESTED]) == NOT_TESTED
    assert combine([]) == NOT_TESTED
