"""The verdict rules, one set for every claim of every report (issue 29 §1): a claim names the region its
paired difference (system − baseline, BLEU) must lie in, and the 95% interval of the test over all seeds decides
(issue 59)."""

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
    "not the paper's. Each claim is tested once over all the seeds of both systems, on the same test sentences: "
    "a bootstrap that resamples the sentences (the same draw for every run) and each system's seeds, and compares "
    "the means over seeds (Clark et al. 2011), so that both the test set and the seed-to-seed spread count. It gives "
    f"the {100 * (1 - ALPHA):g}% interval of the difference and its two-sided p (p < {ALPHA} exactly when the "
    "interval excludes 0); on same-system comparisons of the committed runs it called a difference no more "
    "often than α (calibration.md). **held**: the interval lies inside the claim's region. **did not hold**: it "
    "lies outside. **not significant** (a claim that one system is ahead) or **inconclusive** (any other claim): it "
    "crosses an edge. **not tested**: no run could be tested (no references, or a system without translations); the "
    "means are shown but decide nothing. With one seed a side the test is the paired bootstrap of that pair. Beside "
    "it, each seed pair (seed s against seed s) is tested alone and the pairs significant are counted; the counts "
    "decide nothing, since a per-pair test called a difference between runs of one system more often than α "
    "(calibration.md). A claim over several comparisons (k ≥ 2 saturates: every k against the default k) holds when "
    "each holds and fails when any fails. Swapping the two systems of a \"≥\" claim turns held into did not hold "
    "and back.")

Region = Callable[[PairTest], tuple[float, float]]


@dataclass(frozen=True)
class Rule:
    """A claim's region for the difference system − baseline, and what a verdict neither way is called."""

    region: Region
    undecided: str = INCONCLUSIVE


AHEAD = Rule(lambda t: (0.0, math.inf), NOT_SIGNIFICANT)  # system ≥ baseline: significantly ahead


def within(low: float, high: float) -> Rule:
    return Rule(lambda t: (low, high))


def verdict(test: PairTest | None, rule: Rule) -> str:
    """held / did not hold / rule.undecided by the test over all seeds: its interval inside the rule's region,
    outside it, or across an edge; not tested without a test."""
    if test is None:
        return NOT_TESTED
    low, high = rule.region(test)
    if low < test.low and test.high < high:
        return HELD
    return NOT_HELD if test.high < low or test.low > high else rule.undecided


def combine(verdicts: list[str]) -> str:
    """A claim made of several comparisons: fails if any fails, holds only if all hold."""
    for v in (NOT_HELD, NOT_TESTED, INCONCLUSIVE, NOT_SIGNIFICANT):
        if v in verdicts:
            return v
    return HELD if verdicts else NOT_TESTED
