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
