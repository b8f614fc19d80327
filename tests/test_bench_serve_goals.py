"""What scripts/bench/bench_serve.py computes from its measurements: the issue's ratios and the floor that
Little's law puts under the p99 ratio, and the sentences its references decode."""

from tests.scripts_import import load_script

bs = load_script("bench_serve")


def level(sent_per_s: float, p50: float, p99: float) -> dict:
    return {"sent_per_s": sent_per_s, "p50_s": p50, "p99_s": p99, "errors": {}}


def test_goals_give_the_ratios_and_the_little_floor():
    levels = {1: level(25.0, 0.040, 0.1), 32: level(100.0, 0.25, 0.6), 128: level(120.0, 1.0, 2.0)}
    ref = {"batch32_sent_per_s": 125.0, "single_p50_s": 0.032}
    rows = {goal: measured for goal, _, measured in bs.goals(levels, ref)}
    assert rows["32 clients sentences/s ÷ offline at 32 per batch"] == "0.80"
    assert rows["1 client p50 ÷ offline one-at-a-time"] == "1.25"
    assert rows["32 clients p99 ÷ 1 client p50"] == "15.00"
    # 32 clients at 100 sentences/s wait 0.32 s on average: 8 times the 1-client p50 of 0.04 s
    assert rows["its floor at this throughput: 32 ÷ (sentences/s at 32 × 1 client p50)"] == "8.00"
    assert rows["errors at 128 clients"] == "0"


def test_the_references_decode_what_the_levels_send():
    sentences = ["a", "b", "c"]
    assert bs.sent(sentences, 5) == ["a", "b", "c", "a", "b"]  # drive's request i sends sentence i mod 3
    assert bs.sent(sentences, 2) == ["a", "b"]


def test_the_ratios_take_the_faster_reference():
    before = {"batch32_sent_per_s": 150.0, "single_p50_s": 0.030, "single_n": 300, "batch32_n": 300}
    after = {"batch32_sent_per_s": 200.0, "single_p50_s": 0.036, "single_n": 300, "batch32_n": 300}
    ref = bs.faster([before, after])
    assert (ref["batch32_sent_per_s"], ref["single_p50_s"], ref["single_n"]) == (200.0, 0.030, 300)
