"""relmt.export.graphs.LoopGraph, the whole beam search as one while_loop (issue 76 §1), run eagerly: it gives
beam_search's hypotheses and scores, one sentence and a batch of sentences that finish at different steps, under
each search rule the compiled search step takes as an input. (scripts/bench/search_loop.py compiles it with
AOTInductor and checks it against engine=aoti; docs/results/engines/search_loop.md.)"""

from __future__ import annotations

import pytest
import torch

from relmt.config import PosKind
from relmt.data.tokenizer import BOS_ID, EOS_ID, PAD_ID
from relmt.decode.beam import Rules, beam_search, finished_hypotheses, max_lengths
from relmt.export.graphs import LOOP_STATE, EncoderGraph, GraphMemory, GraphModel, LoopGraph, loop_start, shape_of
from tests.tiny_checkpoints import model_config, random_model

A, B = 1.0, 2  # each sentence's step limit: |x| + 2 (sentences that stop at different steps)
SOURCES = [[5, 9, 13, 7, EOS_ID], [11, 6, EOS_ID], [8, 8, 12, 15, 9, 10, 6, EOS_ID]]


def loop_search(model, src: torch.Tensor, beam: int, min_len: int, lenpen: float, power: bool, t2t: bool,
                early_stop: bool) -> list:
    """LoopGraph's search with each sentence's step limit |x| + 2, its buffers as long as the longest."""
    keep, cross_k, cross_v = EncoderGraph(model)(src)
    limit = max_lengths(keep, A, B)
    inputs = loop_start(keep, cross_k, cross_v, beam, int(limit.max()), limit, model.pad_id, min_len, lenpen, power,
                        t2t, early_stop)
    out = dict(zip(LOOP_STATE, LoopGraph(model)(*inputs)))
    return finished_hypotheses(out["pool_scores"], out["pool_tokens"][:, :, :int(out["t"])], (EOS_ID, PAD_ID))


@pytest.mark.parametrize("rules", [
    dict(beam=4, min_len=1, lenpen=0.2, power=True, t2t=True, early_stop=False),
    dict(beam=3, min_len=0, lenpen=0.6, power=False, t2t=False, early_stop=True),
    dict(beam=1, min_len=2, lenpen=0.0, power=False, t2t=True, early_stop=False),
])
@pytest.mark.parametrize("positions", [PosKind.rel, PosKind.abs])
def test_the_loop_gives_beam_searchs_hypotheses(rules, positions):
    torch.manual_seed(0)
    model = random_model(model_config(positions=positions, relative_share_heads=True), 20, seed=3).eval()
    for batch in ([SOURCES[0]], SOURCES):
        width = max(map(len, batch))
        src = torch.tensor([s + [PAD_ID] * (width - len(s)) for s in batch])
        with torch.no_grad():
            mine = loop_search(model, src, **rules)
            theirs = beam_search(model, src, rules["beam"], BOS_ID, EOS_ID, lenpen=rules["lenpen"], max_len_a=A,
                                 max_len_b=B, nbest=rules["beam"], min_len=rules["min_len"],
                                 early_stop=rules["early_stop"], eos_candidates="t2t" if rules["t2t"] else "fairseq",
                                 length_norm="power" if rules["power"] else "gnmt")
        assert len(mine) == len(theirs) == len(batch)
        for ours, reference in zip(mine, theirs):
            assert [h.tokens for h in ours[:rules["beam"]]] == [h.tokens for h in reference]
            assert [h.score for h in ours[:rules["beam"]]] == pytest.approx([h.score for h in reference], abs=1e-5)


def test_the_loop_runs_on_cuda_as_on_the_cpu():
    """The device lane (tests/fake_cuda.py) runs the loop eagerly on "CUDA": every tensor it makes names the device,
    it gives the CPU's hypotheses, and the host reads the device twice a step (the loop's predicate and the step
    count that sizes the slots so far): what scripts/bench/decode_gpu.py's compiled loop does on a GPU, without
    the per-step search's reads."""
    from tests.fake_cuda import fake_cuda

    rules = dict(beam=4, min_len=1, lenpen=0.6, power=False, t2t=True, early_stop=False)
    model = random_model(model_config(positions=PosKind.rel), 20, seed=3).eval()
    width = max(map(len, SOURCES))
    rows = [s + [PAD_ID] * (width - len(s)) for s in SOURCES]
    with torch.no_grad():
        cpu = loop_search(model, torch.tensor(rows), **rules)
        with fake_cuda() as lane:
            src = torch.tensor(rows, device="cuda")
            steps = int(max_lengths(src != PAD_ID, A, B).max())
            cuda = loop_search(model.to("cuda"), src, **rules)
    loop_reads = [s.where for s in lane.syncs if "export/graphs.py" in s.where]
    assert [[h.tokens for h in hs] for hs in cuda] == [[h.tokens for h in hs] for hs in cpu]
    assert [h.score for hs in cuda for h in hs] == pytest.approx([h.score for hs in cpu for h in hs], abs=1e-5)
    # each step: the predicate and t.item(); then the predicate that ends the loop (here at the step limit)
    assert len(loop_reads) == 2 * steps + 1, loop_reads


class EagerLoop(GraphModel):
    """GraphModel.whole_search over LoopGraph run eagerly (an engine runs it compiled, relmt/export/aoti.py)."""

    def __init__(self, model) -> None:
        super().__init__(shape_of(model))
        self.run_loop = LoopGraph(model)


def test_whole_search_gives_beam_searchs_hypotheses_in_one_call():
    """GraphModel.whole_search, what beam_search calls where an engine `loops`: one call of LoopGraph with buffers
    as long as the longest step limit, and beam_search's hypotheses and scores for sentences that stop at different
    steps."""
    model = random_model(model_config(positions=PosKind.rel, relative_share_heads=True), 20, seed=3).eval()
    width = max(map(len, SOURCES))
    src = torch.tensor([s + [PAD_ID] * (width - len(s)) for s in SOURCES])
    calls = []
    engine = EagerLoop(model)
    loop = engine.run_loop
    engine.run_loop = lambda *inputs: calls.append(inputs[0].shape[2] - 1) or loop(*inputs)
    with torch.no_grad():
        keep, cross_k, cross_v = EncoderGraph(model)(src)
        limit = max_lengths(keep, A, B)
        rule = Rules(EOS_ID, torch.tensor([PAD_ID, BOS_ID]), 1, 0.6, "gnmt", True, False)
        pool_scores, pool_tokens = engine.whole_search(GraphMemory(cross_k, cross_v), keep, 4, limit, rule)
        mine = finished_hypotheses(pool_scores, pool_tokens, (EOS_ID, PAD_ID))
        theirs = beam_search(model, src, 4, BOS_ID, EOS_ID, lenpen=0.6, max_len_a=A, max_len_b=B, nbest=4, min_len=1)
    assert calls == [int(limit.max())]  # one call, its buffers the longest step limit's slots
    assert len(mine) == len(theirs) == len(SOURCES)
    for ours, reference in zip(mine, theirs):
        assert [h.tokens for h in ours] == [h.tokens for h in reference]
        assert [h.score for h in ours] == pytest.approx([h.score for h in reference], abs=1e-5)
