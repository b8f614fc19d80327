"""A forced target prefix and lexical constraints in the one beam search (relmt/decode/constraints.py, issue 60):
the prefix equals teacher-forcing it and then searching, every finished hypothesis holds every constraint (in
order when ordered), and without either, or with empty lists, the search is the plain one exactly."""

from __future__ import annotations

import pytest
import torch

from relmt.decode.beam import beam_search, length_penalty
from relmt.decode.constraints import allocate, unique
from tests.test_incremental import BOS, EOS, batch, make

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


def model64(mode: str = "rel"):
    return make(mode).double()


def contains(seq: list[int], phrase: list[int]) -> int:
    """The index just past phrase's first occurrence in seq, or -1."""
    for i in range(len(seq) - len(phrase) + 1):
        if seq[i:i + len(phrase)] == phrase:
            return i + len(phrase)
    return -1


def in_order(seq: list[int], phrases: list[list[int]]) -> bool:
    for p in phrases:
        end = contains(seq, p)
        if end < 0:
            return False
        seq = seq[end:]
    return True


def teacher_forced(model, src: torch.Tensor, row: int, tokens: list[int]) -> tuple[float, list[float]]:
    """log P(tokens + EOS | src[row]) by one full decoder pass, and each token's log-probability."""
    memory, mask = model.encode(src[row:row + 1])
    tgt = torch.tensor([[BOS, *tokens]])
    logp = torch.log_softmax(model.decode(tgt, memory, mask)[0].double(), -1)
    steps = logp[torch.arange(len(tokens) + 1), torch.tensor([*tokens, EOS])].tolist()
    return sum(steps), steps


def expected_score(model, src, row: int, tokens: list[int], limit: int) -> float:
    """log P(y) / lp(|y|) by teacher forcing: with EOS, or as the search scores a hypothesis cut at its step
    limit, without it."""
    total, steps = teacher_forced(model, src, row, tokens)
    if len(tokens) == limit:
        return (total - steps[-1]) / length_penalty(len(tokens), 0.6)
    return total / length_penalty(len(tokens) + 1, 0.6)


def limit_of(src, row: int, needed: int = 0) -> int:
    return max(int((src[row] != 0).sum()) + 6, needed)


def search(model, src, beam=4, **kw):
    return beam_search(model, src, beam, BOS, EOS, lenpen=0.6, max_len_a=1.0, max_len_b=6, nbest=beam, **kw)


@pytest.mark.parametrize("mode", ["abs", "rel", "t5"])
def test_an_empty_prefix_and_empty_constraint_lists_are_the_plain_search_exactly(mode):
    model, (src, _) = model64(mode), batch()
    plain = search(model, src)
    assert search(model, src, prefixes=[[], [], []], constraints=[[], [], [[]]], ordered=True) == plain


def test_a_greedy_prefix_continues_as_greedy_decoding_from_it():
    """Beam 1 from the prefix: at each step past it, the argmax of a full teacher-forced pass."""
    model, (src, _) = model64(), batch()
    prefixes = [[20, 21], [7], [9, 9, 9]]
    hyps = search(model, src, beam=1, prefixes=prefixes)
    for row, (prefix, h) in enumerate(zip(prefixes, hyps)):
        out, memory, mask = list(prefix), *model.encode(src[row:row + 1])
        limit = max(int((src[row] != 0).sum()) + 6, len(prefix) + 1)
        while len(out) < limit:
            logits = model.decode(torch.tensor([[BOS, *out]]), memory, mask)[0, -1]
            logits[[0, BOS]] = float("-inf")
            nxt = int(logits.argmax())
            if nxt == EOS:
                break
            out.append(nxt)
        assert h[0].tokens == out


@pytest.mark.parametrize("mode", ["abs", "rel", "both"])
def test_prefixed_hypotheses_begin_with_the_prefix_and_score_as_teacher_forcing(mode):
    model, (src, _) = model64(mode), batch()
    prefixes = [[20, 21, 22], [], [13]]
    for row, hyps in enumerate(search(model, src, prefixes=prefixes)):
        assert hyps
        for h in hyps:
            assert h.tokens[:len(prefixes[row])] == prefixes[row]
            expected = expected_score(model, src, row, h.tokens, limit_of(src, row, len(prefixes[row]) + 1))
            assert h.score == pytest.approx(expected, abs=1e-5)  # the search adds float32 log-probabilities


def test_a_prefix_longer_than_the_step_limit_still_fits():
    model, (src, _) = model64(), batch()
    prefix = list(range(4, 24))  # 20 tokens; the limit of the second source is 2 + 6
    hyps = search(model, src, prefixes=[[], prefix, []])
    assert all(h.tokens[:20] == prefix for h in hyps[1])


@pytest.mark.parametrize("ordered", [False, True])
@pytest.mark.parametrize("mode", ["abs", "rel"])
def test_every_finished_hypothesis_holds_every_constraint(mode, ordered):
    model, (src, _) = model64(mode), batch()
    constraints = [[[31, 32], [38]], [[17]], [[25, 26, 27], [8], [33, 34]]]
    hyps = search(model, src, constraints=constraints, ordered=ordered)
    for row, hs in enumerate(hyps):
        assert hs
        for h in hs:
            assert h.unmet == 0
            assert all(contains(h.tokens, p) >= 0 for p in constraints[row]), (h.tokens, constraints[row])
            if ordered:
                assert in_order(h.tokens, constraints[row])
            needed = sum(map(len, constraints[row])) + 1
            assert h.score == pytest.approx(expected_score(model, src, row, h.tokens, limit_of(src, row, needed)),
                                            abs=1e-5)


def test_a_sentence_without_constraints_in_a_constrained_batch_gets_the_plain_search():
    model, (src, _) = model64(), batch()
    plain = search(model, src)
    mixed = search(model, src, constraints=[[[31, 32]], [], [[38]]])
    assert mixed[1] == plain[1]


@pytest.mark.parametrize("beam,eos", [(1, "fairseq"), (2, "fairseq"), (3, "t2t")])
def test_a_sentence_without_constraints_is_untouched_at_every_eos_rule_and_beam(beam, eos):
    """Issue 69 defect 2: with beam 1 or eos_candidates=fairseq, sentences without constraints in a batch with some
    changed ("r rusa ga deku ze" became "r"): every EOS candidate finished there, whatever the rule said."""
    model, (src, _) = model64(), batch()
    with torch.no_grad():  # EOS competes from the first steps: candidates ranked K..2K-1 are EOS
        model.tgt_embed.weight[EOS] *= 6
    kw = dict(eos_candidates=eos, early_stop=beam == 1)
    plain = beam_search(model, src, beam, BOS, EOS, lenpen=0.6, max_len_a=1.0, max_len_b=6, nbest=beam, **kw)
    mixed = beam_search(model, src, beam, BOS, EOS, lenpen=0.6, max_len_a=1.0, max_len_b=6, nbest=beam,
                        constraints=[[[31, 32]], [], []], **kw)
    assert mixed[1:] == plain[1:]


@pytest.mark.parametrize("t2t", [False, True])
def test_the_constrained_step_leaves_an_unconstrained_sentences_eos_rule_alone(t2t):
    """One step, beam 1, of two sentences: the first constrained, the second not, whose best token is 5 and second
    EOS. Under fairseq's rule that EOS (ranked K..2K-1) does not finish, under t2t's it does: as in a batch of the
    second sentence alone. (Before, every EOS candidate of a constrained batch finished.)"""
    from relmt.decode.beam import Beams, Rules, beam_step
    from relmt.decode.constraints import make_forced

    vocab, pad = 8, 0
    logits = torch.full((2, vocab), -5.0)
    logits[:, 5], logits[:, EOS] = 2.0, 1.0
    rules = Rules(EOS, torch.tensor([pad, BOS]), 0, 0.6, "gnmt", t2t, False)

    def start(n, forced=None):
        return Beams(torch.full((n, 1), BOS), torch.zeros(n, 1), torch.full((n, 1), float("-inf")),
                     torch.zeros(n, 1, 0, dtype=torch.long), torch.full((n,), 10), forced)

    forced = make_forced(None, [[[6]], []], False, 2, 1, torch.device("cpu"))
    mixed, _, _ = beam_step(logits.clone(), start(2, forced), rules, pad)
    alone, _, _ = beam_step(logits[1:].clone(), start(1), rules, pad)
    assert torch.equal(mixed.pool_scores[1:], alone.pool_scores) and torch.equal(mixed.tokens[1:], alone.tokens)
    assert torch.isfinite(alone.pool_scores).any() == t2t


def test_two_phrases_that_begin_with_the_same_token_are_both_met():
    """Issue 69 defect 1: ["the dog", "the cat"] with beam 1 wrote "the the the ..." to the step limit, both
    unmet: a bank that summed every phrase's partial match did not grow along the path that met one."""
    from relmt.decode.constraints import banks, make_forced

    f = make_forced(None, [[[5, 6], [5, 7]]], False, 1, 1, torch.device("cpu"))
    progress = torch.tensor([[[1, 1], [2, 0], [2, 1], [2, 2]]])  # "the"; "the dog"; "the dog the"; both
    assert banks(f, progress).tolist() == [[1, 2, 3, 4]]
    model, (src, _) = model64(), batch()
    for beam in (1, 2):
        hyps = search(model, src[:1], beam=beam, constraints=[[[31, 32], [31, 33]]])
        assert hyps[0] and all(h.unmet == 0 and contains(h.tokens, [31, 32]) >= 0 and contains(h.tokens, [31, 33])
                               >= 0 for h in hyps[0]), [h.tokens for h in hyps[0]]


def test_constraints_and_a_prefix_together():
    model, (src, _) = model64(), batch()
    hyps = search(model, src, prefixes=[[9, 10], [], []], constraints=[[[31]], [[17, 18]], []])
    assert all(h.tokens[:2] == [9, 10] and 31 in h.tokens for h in hyps[0])
    assert all(contains(h.tokens, [17, 18]) >= 0 for h in hyps[1])


def test_allocate_takes_the_banks_in_turn_most_met_first():
    scores = torch.tensor([[-1.0, -2.0, -3.0, -4.0, -5.0, -0.5]])
    banks = torch.tensor([[0, 0, 1, 1, 2, 0]])
    live = torch.tensor([[True, True, True, True, True, False]])  # the best one is an EOS
    assert allocate(scores, banks, live, 4).tolist() == [[4, 2, 0, 3]]


def test_unique_keeps_the_first_of_each_row_and_token():
    rows, tokens = torch.tensor([[0, 1, 0, 0, 1]]), torch.tensor([[5, 5, 5, 6, 5]])
    assert unique(rows, tokens, 10).tolist() == [[True, True, False, True, False]]


def test_a_search_stops_when_asked_before_a_step():
    """Issue 69 defect 3: relmt-serve stops a batch whose clients all left. stop() is asked before each step; the
    sentences unfinished then get no hypotheses, and a stop that never says True changes nothing."""
    model, (src, _) = model64(), batch()
    asked = []

    def stop_after_two():
        asked.append(1)
        return len(asked) > 2

    constraints = [[[31, 32]], [[17]], []]
    plain = search(model, src, constraints=constraints)
    assert search(model, src, constraints=constraints, stop=lambda: False) == plain
    stopped = search(model, src, constraints=constraints, stop=stop_after_two)
    assert len(asked) == 3 and stopped == [[], [], []]


# Issue 74 §3.3: the rule (relmt/decode/constraints.py's docstring) is fairseq's: each phrase is met by its own
# occurrence, a phrase given twice needs two, occurrences do not overlap, and ordered is unordered plus order.

def reference_counts(phrases: list[list[int]], seq: list[int], ordered: bool) -> list[tuple[int, int, bool]]:
    """The rule read naively, greedy left to right with one partial match (`path`), as fairseq's constraint states
    match: after each token of seq, the bank (tokens of the phrases met and the path's length), the phrases met if
    the output ended there (a phrase the path holds whole, while a longer one goes on, counts) and whether every
    phrase is met (EOS allowed)."""
    met, path, out = [False] * len(phrases), [], []

    def open_phrases() -> list[int]:
        unmet = [i for i, m in enumerate(met) if not m]
        return unmet[:1] if ordered else unmet

    def held() -> int | None:  # the longest (then lowest-numbered) open phrase the path holds whole
        whole = [i for i in open_phrases() if len(phrases[i]) <= len(path) and path[:len(phrases[i])] == phrases[i]]
        return max(whole, key=lambda i: (len(phrases[i]), -i), default=None)

    def extend(x: int) -> bool:
        nonlocal path
        new = path + [x]
        ext = [i for i in open_phrases() if phrases[i][:len(new)] == new]
        if ext and any(len(phrases[i]) > len(new) for i in ext):
            path = new
        elif ext:  # it completes a phrase that nothing longer goes on from: met here
            met[ext[0]], path = True, []
        return bool(ext)

    for x in seq:
        if not extend(x):  # the path ends: the phrase it holds whole is met; x may begin a new one
            if (h := held()) is not None:
                met[h] = True
            path = []
            extend(x)
        bank = sum(len(p) for p, m in zip(phrases, met) if m) + len(path)
        out.append((bank, sum(met) + (held() is not None), all(met)))
    return out


def bank_counts(phrases: list[list[int]], seq: list[int], ordered: bool) -> list[tuple[int, int, bool]]:
    """The same, of relmt/decode/constraints.py: one live beam (K = 1) advanced token by token."""
    from dataclasses import replace

    from relmt.decode.constraints import advance, all_met, banks, make_forced, unmet_count

    f = make_forced(None, [phrases], ordered, 1, 1, torch.device("cpu"))
    out = []
    for x in seq:
        progress = advance(f, torch.zeros(1, 1, dtype=torch.long), torch.tensor([[x]]))
        f = replace(f, progress=progress[0])
        out.append((int(banks(f, progress)), len(phrases) - int(unmet_count(f, progress)),
                    bool(all_met(f, f.progress))))
    return out


def test_a_phrase_given_twice_needs_two_occurrences_in_either_mode():
    """[a], [a]: one a meets one of them (bank 1, as fairseq's), a second a the other; ordered agrees. Before, one
    a met both unordered (bank 2) while ordered needed two."""
    for ordered in (False, True):
        assert bank_counts([[5], [5]], [5], ordered) == [(1, 1, False)], ordered
        assert bank_counts([[5], [5]], [5, 9, 5], ordered)[-1] == (2, 2, True), ordered
        assert bank_counts([[5, 6], [5, 6]], [5, 6, 5, 6], ordered) == [(1, 0, False), (2, 1, False), (3, 1, False),
                                                                        (4, 2, True)], ordered


def test_overlapping_phrases_need_separate_occurrences_in_either_mode():
    """[a b], [b c]: "a b c" meets one of them (its b serves one phrase), "a b b c" both; ordered agrees, and the
    other order needs them the other way round. Before, "a b c" met both unordered."""
    for ordered in (False, True):
        assert bank_counts([[5, 6], [6, 7]], [5, 6, 7], ordered) == [(1, 0, False), (2, 1, False), (2, 1, False)], \
            ordered
        assert bank_counts([[5, 6], [6, 7]], [5, 6, 6, 7], ordered)[-1] == (4, 2, True), ordered
        assert bank_counts([[6, 7], [5, 6]], [5, 6, 6, 7], ordered)[-1] == ((4, 2, True) if not ordered else
                                                                           (2, 1, False)), ordered


# (modes, phrases, output, fairseq's bank and completed count after each token, finished at the end), worked by
# hand from fairseq/token_generation_constraints.py (UnorderedConstraintState: bank = sum(generated),
# num_completed; OrderedConstraintState: bank = state + 1, the endpoints passed); modes: False unordered, True
# ordered. ([5 6], [7 8]) and "5 6 7 9 7 8" is unordered only: fairseq's ordered state goes back to the first
# phrase at 9 (bank 0), where the rule keeps [5 6] met.
FAIRSEQ = [
    ((False, True), [[5], [5]], [5, 5], [1, 2], [1, 2], True),
    ((False, True), [[5, 6], [6, 7]], [5, 6, 7], [1, 2, 2], [0, 1, 1], False),
    ((False, True), [[5, 6], [6, 7]], [5, 6, 6, 7], [1, 2, 3, 4], [0, 1, 1, 2], True),
    ((False, True), [[5, 6], [5, 7]], [5, 5, 6, 5, 7], [1, 1, 2, 3, 4], [0, 0, 1, 1, 2], True),
    ((False,), [[5, 6], [7, 8]], [5, 6, 7, 9, 7, 8], [1, 2, 3, 2, 3, 4], [0, 1, 1, 1, 1, 2], True),
    ((False,), [[5, 6, 7], [8]], [5, 6, 8, 8, 5, 6, 7], [1, 2, 1, 1, 2, 3, 4], [0, 0, 1, 1, 1, 1, 2], True),
    ((True,), [[5, 6, 7], [8]], [5, 6, 8, 8, 5, 6, 7], [1, 2, 0, 0, 1, 2, 3], [0, 0, 0, 0, 0, 0, 1], False),
    ((False,), [[5], [5, 6]], [5, 6, 5], [1, 2, 3], [1, 1, 2], True),
    ((True,), [[5], [5, 6]], [5, 6, 5], [1, 1, 2], [1, 1, 1], False),
]


def test_counts_equal_fairseqs_on_hand_worked_outputs():
    """Before, unordered counted [5], [5] met by one 5 and [5 6], [6 7] by "5 6 7" (bank 3, fairseq's 2)."""
    for modes, phrases, seq, bank, completed, finished in FAIRSEQ:
        for ordered in modes:
            got = bank_counts(phrases, seq, ordered)
            assert ([b for b, _, _ in got], [c for _, c, _ in got], got[-1][2]) == (bank, completed, finished), \
                (ordered, phrases, seq, got)
            assert got == reference_counts(phrases, seq, ordered)


def test_counts_equal_a_naive_reading_of_the_rule_on_random_outputs():
    """Random phrases and outputs over a tiny vocabulary (5..8, 9 in no phrase): the bank, the phrases met and
    whether all are, after each token, as the naive reference counts them; and the phrases written out in order
    with a token between them meet all of them in either mode."""
    rng = torch.Generator().manual_seed(74)

    def draw(lo: int, hi: int, n: int) -> list[int]:
        return torch.randint(lo, hi, (n,), generator=rng).tolist()

    for _ in range(100):
        phrases = [draw(5, 8, int(draw(1, 4, 1)[0])) for _ in range(int(draw(1, 5, 1)[0]))]
        seq = draw(5, 10, int(draw(1, 14, 1)[0]))
        written = [t for p in phrases for t in [*p, 9]]
        for ordered in (False, True):
            assert bank_counts(phrases, seq, ordered) == reference_counts(phrases, seq, ordered), \
                (ordered, phrases, seq)
            assert bank_counts(phrases, written, ordered)[-1] == (len(written) - len(phrases), len(phrases), True)


def constrained_pool(constraints: list[list[int]], ordered: bool, beam: int = 4) -> list[tuple[list[int], int]]:
    """The finished hypotheses (tokens without EOS, phrases missed) of a beam search over fixed logits that favour
    EOS, then 5, 6, 7 alike: whatever meets the constraints soonest ends there."""
    from relmt.decode.beam import Beams, Rules, beam_step, finished_hypotheses
    from relmt.decode.constraints import make_forced

    vocab, pad = 10, 0
    logits = torch.full((beam, vocab), -4.0)
    logits[:, EOS], logits[:, 5:8] = 3.0, 1.0
    rules = Rules(EOS, torch.tensor([pad, BOS]), 0, 0.6, "gnmt", True, False)
    forced = make_forced(None, [constraints], ordered, 1, beam, torch.device("cpu"))
    beams = Beams(torch.full((beam, 1), BOS), torch.tensor([[0.0] + [float("-inf")] * (beam - 1)]),
                  torch.full((1, beam), float("-inf")), torch.zeros(1, beam, 0, dtype=torch.long),
                  torch.tensor([8]), forced)
    for _ in range(8):
        beams, _, done = beam_step(logits.clone(), beams, rules, pad)
        if done.all():
            break
    return [(h.tokens, h.unmet) for h in finished_hypotheses(beams.pool_scores, beams.pool_tokens, (EOS, pad),
                                                             beams.forced.pool_unmet)[0]]


@pytest.mark.parametrize("constraints", [[[5], [5]], [[5, 6], [6, 7]], [[5], [5, 6]]])
def test_every_finished_hypothesis_meets_each_phrase_by_its_own_occurrence(constraints):
    """A search whose model would end as soon as it may: every hypothesis it finishes holds each phrase by an
    occurrence of its own (by the naive reference), in order when ordered. Before, "5" met [5], [5] and "5 6 7"
    met [5 6], [6 7] (unordered; ordered needed them apart already)."""
    for ordered in (False, True):
        pool = constrained_pool(constraints, ordered)
        assert pool
        for tokens, unmet in pool:
            assert unmet == 0 and reference_counts(constraints, tokens, ordered)[-1][2], (ordered, tokens, pool)
