"""relmt.export.graphs.LoopGraph, the whole beam search as one while_loop (issue 76 §1), run eagerly: it gives
beam_search's hypotheses and scores, one sentence and a batch of sentences that finish at different steps, under
each search rule the compiled search step takes as an input. (scripts/bench/search_loop.py compiles it with
AOTInductor and checks it against engine=aoti; docs/results/engines/search_loop.md.)"""

from __future__ import annotations

import pytest
import torch

from relmt.config import PosKind
from relmt.data.tokenizer import BOS_ID, EOS_ID, PAD_ID
from relmt.decode.beam import beam_search, finished_hypotheses, max_lengths
from relmt.export.graphs import LoopGraph, shape_of
from tests.tiny_checkpoints import model_config, random_model

A, B = 1.0, 2  # each sentence's step limit: |x| + 2 (sentences that stop at different steps)
SOURCES = [[5, 9, 13, 7, EOS_ID], [11, 6, EOS_ID], [8, 8, 12, 15, 9, 10, 6, EOS_ID]]


def loop_search(model, src: torch.Tensor, beam: int, min_len: int, lenpen: float, power: bool, t2t: bool,
                early_stop: bool) -> list:
    """LoopGraph's search with each sentence's step limit |x| + 2, its buffers as long as the longest."""
    shape = shape_of(model)
    memory, keep = model.encode(src)
    limit = max_lengths(keep, A, B)
    slots = int(limit.max())
    cross = [torch.stack(kv) for kv in zip(*(layer.cross_attn.project_kv(memory) for layer in model.decoder_layers))]
    b = src.shape[0]
    history = torch.full((b, beam, slots + 1), PAD_ID)
    history[:, :, 0] = BOS_ID
    alive = torch.full((b, beam), float("-inf"))
    alive[:, 0] = 0.0
    cache = torch.zeros(shape["layers"], b, beam, shape["heads"], slots, shape["d_head"])
    pool_scores, pool_tokens, steps = LoopGraph(model)(
        history, keep, *cross, cache, cache.clone(), alive, torch.full((b, beam), float("-inf")),
        torch.full((b, beam, slots), PAD_ID), limit, torch.tensor(min_len),
        torch.tensor(lenpen, dtype=torch.float64), torch.tensor(power), torch.tensor(t2t), torch.tensor(early_stop))
    return finished_hypotheses(pool_scores, pool_tokens[:, :, :int(steps)], (EOS_ID, PAD_ID))


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
