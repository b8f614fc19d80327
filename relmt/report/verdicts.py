"""The verdict rules, one set for every claim of every report (issue 29 §1): a claim names the region its
paired difference (system − baseline, BLEU) must lie in, and each seed pair's 95% interval votes."""

import math
from collections.abc import Callable
from dataclasses import dataclass

from relmt.report.significance import ALPHA, PairTest

# Fixed before any run was read, and stated in each report above its claims: our choice, not the paper's.
MARGIN = 1.0  # BLEU: two systems are "about as good" when their difference lies within ±MARGIN
SLIGHT = 2.0  # BLEU: "slightly lower" is behind by more than 0 and less than SLIGHT
HELD, NOT_HELD, NOT_SIGNIFICANT, INCONCLUSIVE, NOT_TESTED = (
    "held", "did not hold", "not significant", "inconclusive", "not tested")
RULES = (
    "Verdicts. Every claim is a statement about the paired difference system − baseline, in BLEU, on one test set: "
    "\"system ≥ baseline\" says it is above 0; an equivalence claim (\"about as good\", \"no further gain\", "
    f"\"saturates\") says it lies within a margin of ±{MARGIN:g} BLEU (below +{MARGIN:g} for \"no further gain\"); "
    f"\"slightly lower\" says the baseline is behind by more than 0 and less than {SLIGHT:g} BLEU; \"collapses\" says "
    "k = 0 is behind by more than half of the other's BLEU. These margins are our choice, fixed before the numbers, "
    "not the paper's. Each claim is tested seed by seed (seed s against seed s, the same test sentences) with a paired "
    f"bootstrap, which gives the {100 * (1 - ALPHA):g}% interval of the difference and its two-sided p (p < {ALPHA} "
    "exactly when the interval excludes 0). A seed pair supports the claim when its interval lies inside the claim's "
    "region and contradicts it when the interval lies outside. **held**: more than half of the seed pairs support it. "
    "**did not hold**: more than half contradict it. **not significant** (a claim that one system is ahead) or "
    "**inconclusive** (any other claim): neither. **not tested**: no seed pair could be tested (no references, or no "
    "seed in common); the means are shown but decide nothing. A claim over several comparisons (k ≥ 2 saturates: every "
    "k against the default k) holds when each holds and fails when any fails. Swapping the two systems of a \"≥\" "
    "claim turns held into did not hold and back.")

Region = Callable[[PairTest], tuple[float, float]]


@dataclass(frozen=True)
class Rule:
    """A claim's region for the difference system − baseline, and what a verdict neither way is called."""

    region: Region
    undecided: str = INCONCLUSIVE


AHEAD = Rule(lambda t: (0.0, math.inf), NOT_SIGNIFICANT)  # system ≥ baseline: significantly ahead


def within(low: float, high: float) -> Rule:
    return Rule(lambda t: (low, high))


def verdict(tests: list[PairTest], rule: Rule) -> str:
    """held / did not hold / rule.undecided by the majority of seed pairs, each voting with its interval: inside
    the rule's region (for), outside it (against) or across an edge (neither); not tested without any pair."""
    if not tests:
        return NOT_TESTED
    regions = [(t, *rule.region(t)) for t in tests]
    if 2 * sum(low < t.low and t.high < high for t, low, high in regions) > len(tests):
        return HELD
    against = sum(t.high < low or t.low > high for t, low, high in regions)
    return NOT_HELD if 2 * against > len(tests) else rule.undecided


def combine(verdicts: list[str]) -> str:
    """A claim made of several comparisons: fails if any fails, holds only if all hold."""
    for v in (NOT_HELD, NOT_TESTED, INCONCLUSIVE, NOT_SIGNIFICANT):
        if v in verdicts:
            return v
    return HELD if verdicts else NOT_TESTED
