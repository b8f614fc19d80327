"""Continuous batching (relmt/decode/continuous.py): a sentence that joins a running beam search at a
step boundary gets the hypotheses that beam_search gives it alone, in every position mode it serves."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from relmt.config import DecodeConfig
from relmt.decode import continuous
from relmt.decode.beam import beam_search
from tests.test_incremental import MODES, make
from tests.test_search_graph import EagerGraphs

PAD, BOS, EOS = 0, 2, 3
SOURCES = [[5, 9, 12, 7, 30], [8, 11], [6, 6, 6, 6], [14, 5], [9, 9, 21, 4, 4, 17, 8]]
SERVED = [m for m in MODES if m != "rope"]


def src_of(ids: list[list[int]]) -> torch.Tensor:
    src = torch.full((len(ids), max(map(len, ids)) + 1), PAD)
    for row, x in enumerate(ids):
        src[row, : len(x)] = torch.tensor(x)
        src[row, len(x)] = EOS
    return src


def alone(model, ids: list[int], cfg: DecodeConfig):
    greedy = cfg.beam == 1
    return beam_search(model, src_of([ids]), cfg.beam, BOS, EOS, cfg.lenpen, cfg.max_len_a, cfg.max_len_b,
                       nbest=cfg.nbest, early_stop=cfg.early_stop or greedy, min_len=cfg.min_len,
                       eos_candidates="fairseq" if greedy else cfg.eos_candidates, length_norm=cfg.length_norm)[0]


def run_schedule(model, cfg: DecodeConfig, schedule: dict[int, list[int]]) -> dict[int, list]:
    """Decode SOURCES, sentence i joining before step schedule-step (schedule: step -> sentence indices);
    a step with nothing running waits for the next joiners. Returns each sentence's hypotheses."""
    run, out, step = None, {}, 0
    while len(out) < sum(map(len, schedule.values())):
        if step in schedule:
            new = continuous.start(model, src_of([SOURCES[i] for i in schedule[step]]), schedule[step], cfg, BOS)
            run = continuous.join(run, new, PAD)
        if run is not None:
            run, finished = continuous.advance(model, run, cfg, BOS, EOS)
            out.update(finished)
        step += 1
    return out


def graphs_of(model, on: str):
    """The model itself, or an engine's graphs run eagerly: with its search graph, or its step graph alone (an
    engine without a search graph, engine=onnx)."""
    if on == "model":
        return model
    graphs = EagerGraphs(model)
    if on == "step graph":
        graphs.run_search = None
    return graphs


@pytest.mark.parametrize("on", ["model", "search graph", "step graph"])
@pytest.mark.parametrize("mode", SERVED)
def test_sentences_joining_a_running_search_get_what_they_get_alone(mode, on, float64):
    """Sentences join at steps 0, 2 and 3, and after the first ones finished (the cut of unused front
    slots); each gets beam_search's hypotheses for it alone: the same tokens, the scores to rounding. On an
    engine's graphs too, whose joins copy no cache, and whose cuts the search graph's next step makes in its own
    copy of the cache (a step graph's wait for a quarter of the slots)."""
    model = make(mode)
    cfg = DecodeConfig(beam=3, nbest=3, lenpen=0.6, max_len_a=1.0, max_len_b=4)
    out = run_schedule(graphs_of(model, on), cfg, {0: [0], 2: [1, 2], 3: [3], 12: [4]})
    for i, hyps in out.items():
        want = alone(model, SOURCES[i], cfg)
        assert [h.tokens for h in hyps] == [h.tokens for h in want], f"sentence {i}"
        assert [h.score for h in hyps] == pytest.approx([h.score for h in want], abs=1e-9)


@pytest.mark.parametrize("mode,gone", [("rel", (0, 4)), ("abs", (0, 4)), ("rel", (0, 1, 2))])
def test_sentences_whose_client_left_drop_out_and_the_others_get_what_they_get_alone(mode, gone, float64):
    """relmt-serve takes the sentences of a request whose client left out of the running search before its next
    step (continuous.drop): the others go on as if those had never joined, their hypotheses beam_search's alone
    (with (0, 1, 2) gone, the slots before the late joiners are cut), and dropping every sentence ends the
    search."""
    model = make(mode)
    cfg = DecodeConfig(beam=3, nbest=2, lenpen=0.6, max_len_a=1.0, max_len_b=6)
    run = continuous.start(model, src_of(SOURCES[:3]), [0, 1, 2], cfg, BOS)
    out = {}
    for step in range(40):
        if step == 2:
            run = continuous.join(run, continuous.start(model, src_of(SOURCES[3:]), [3, 4], cfg, BOS), PAD)
        if step == 3:  # the clients of these sentences leave
            run = continuous.drop(run, [key not in gone for key in run.keys], PAD)
            assert run.keys == tuple(k for k in range(5) if k not in gone)
        run, finished = continuous.advance(model, run, cfg, BOS, EOS)
        out.update(finished)
        if run is None:
            break
    assert sorted(out) == [k for k in range(5) if k not in gone]
    for i, hyps in out.items():
        want = alone(model, SOURCES[i], cfg)
        assert [h.tokens for h in hyps] == [h.tokens for h in want], f"sentence {i}"
        assert [h.score for h in hyps] == pytest.approx([h.score for h in want], abs=1e-9)
    run = continuous.start(model, src_of(SOURCES[:2]), [0, 1], cfg, BOS)
    assert continuous.drop(run, [False, False], PAD) is None


@pytest.mark.parametrize("options", [dict(beam=1), dict(beam=2, eos_candidates="fairseq"), dict(min_len=4, nbest=2),
                                     dict(early_stop=True, lenpen=1.0), dict(length_norm="power", lenpen=1.0)],
                         ids=["greedy", "fairseq", "min_len", "early_stop", "power"])
@pytest.mark.parametrize("on", ["model", "search graph"])
def test_every_search_option_holds_when_joining(options, on, float64):
    """On the model (beam_step in Python with each sentence's step count) and on an engine's search graph (the same
    step in one call, the settings as its inputs)."""
    model = make("rel")
    cfg = replace(DecodeConfig(beam=3, max_len_a=1.0, max_len_b=4), **options)
    out = run_schedule(model if on == "model" else EagerGraphs(model), cfg, {0: [0, 4], 1: [1], 5: [2, 3]})
    for i, hyps in out.items():
        want = alone(model, SOURCES[i], cfg)
        assert [h.tokens for h in hyps] == [h.tokens for h in want], f"sentence {i}"
        assert [h.score for h in hyps] == pytest.approx([h.score for h in want], abs=1e-9)
    if "min_len" in options:
        assert all(len(h.tokens) >= 4 for hs in out.values() for h in hs)


def test_joined_all_at_once_in_float32_is_beam_search_of_the_batch():
    """In the precision decoding runs in, a batch that starts together is the batch beam_search decodes."""
    model = make("rel")
    cfg = DecodeConfig(beam=4, nbest=2, max_len_a=1.0, max_len_b=5)
    out = run_schedule(model, cfg, {0: list(range(len(SOURCES)))})
    want = beam_search(model, src_of(SOURCES), 4, BOS, EOS, 0.6, 1.0, 5, nbest=2)
    assert [[h.tokens for h in out[i]] for i in range(len(SOURCES))] == [[h.tokens for h in w] for w in want]
    for i, w in enumerate(want):
        assert [h.score for h in out[i]] == pytest.approx([h.score for h in w], rel=1e-5)


def test_the_unused_front_slots_are_cut():
    model = make("abs")
    cfg = DecodeConfig(beam=2, max_len_a=0.0, max_len_b=3)  # every sentence stops at step 3
    run = continuous.start(model, src_of([SOURCES[0]]), [0], cfg, BOS)
    for _ in range(2):
        run, _ = continuous.advance(model, run, cfg, BOS, EOS)
    run = continuous.join(run, continuous.start(model, src_of([SOURCES[1]]), [1], cfg, BOS), PAD)
    assert run.starts.tolist() == [0, 2] and run.cache.length == 2
    run, finished = continuous.advance(model, run, cfg, BOS, EOS)
    assert [key for key, _ in finished] == [0] and run.keys == (1,)
    assert run.starts.tolist() == [0] and run.cache.length == 1 and run.tokens.shape[1] == 2  # BOS, one token


def test_rope_and_sampling_are_served_batch_by_batch():
    assert continuous.supports(make("rel"), DecodeConfig())
    assert not continuous.supports(make("rope"), DecodeConfig())  # keys rotated by slot: slots never shift here
    assert not continuous.supports(make("rel"), DecodeConfig(sampling=True))


@pytest.mark.parametrize("mode", SERVED)
def test_an_engines_graphs_join_as_the_model_does(mode, float64):
    """Continuous batching on an engine (issue 62 §3): relmt/export/graphs.py's step graph, run eagerly here
    (tests/test_engines.py compiles it), takes the rows' starts; sentences that join it get the hypotheses that
    beam_search gives each alone on the model itself."""
    model = make(mode)
    graphs = EagerGraphs(model)
    cfg = DecodeConfig(beam=3, nbest=2, lenpen=0.6, max_len_a=1.0, max_len_b=4)
    assert continuous.supports(graphs, cfg)
    out = run_schedule(graphs, cfg, {0: [0], 2: [1, 2], 3: [3], 12: [4]})
    # every step, before and after the late joiners, is one call of the search graph with the sentences' starts
    # (issue 70): the step graph and beam_step in Python are not called
    assert graphs.calls["search"] > 0 and graphs.calls["step"] == 0
    for i, hyps in out.items():
        want = alone(model, SOURCES[i], cfg)
        assert [h.tokens for h in hyps] == [h.tokens for h in want], f"sentence {i}"
        assert [h.score for h in hyps] == pytest.approx([h.score for h in want], abs=1e-9)


def test_an_engine_without_a_search_graph_joins_through_its_step_graph(float64):
    """engine=onnx has a step graph and no search graph: each step is the step graph with the starts, and beam_step
    in Python with each sentence's own step count."""
    model = make("rel")
    graphs = EagerGraphs(model)
    graphs.run_search = None
    cfg = DecodeConfig(beam=3, nbest=2, lenpen=0.6, max_len_a=1.0, max_len_b=4, min_len=2)
    out = run_schedule(graphs, cfg, {0: [0], 2: [1, 2], 3: [3], 12: [4]})
    assert graphs.calls["step"] > 0 and graphs.calls["search"] == 0
    for i, hyps in out.items():
        want = alone(model, SOURCES[i], cfg)
        assert [h.tokens for h in hyps] == [h.tokens for h in want], f"sentence {i}"
        assert [h.score for h in hyps] == pytest.approx([h.score for h in want], abs=1e-9)


def test_engines_without_starts_or_with_rope_are_served_batch_by_batch():
    assert not continuous.supports(EagerGraphs(make("rope")), DecodeConfig())
    old = EagerGraphs(make("rel"))
    old.starts = old.continuous = False  # an export made before the step graph took starts (GRAPHS_VERSION < 3)
    assert not continuous.supports(old, DecodeConfig())
    assert continuous.supports(EagerGraphs(make("rel")), DecodeConfig())


@pytest.mark.parametrize("on", ["search graph", "step graph"])
def test_an_engine_cache_joins_and_is_cut_without_a_copy(on, float64):
    """On an engine's graphs (relmt/export/graphs.py's GraphCache) a join copies no keys or values: the new
    hypotheses continue a stored row that their starts mask out. A cut of the front slots copies nothing either:
    the search graph's next step leaves them out of the copy of the cache it makes anyway, so `trim` cuts at once,
    and that step's cache holds the slots in use alone. A step graph takes its cache contiguous (the engine's call
    copies the view), so there `trim` leaves fewer than a quarter of the slots in place, masked."""
    graphs = graphs_of(make("rel"), on)
    cfg = DecodeConfig(beam=2, max_len_a=3.0, max_len_b=20)
    run = continuous.start(graphs, src_of(SOURCES[:1]), [0], cfg, BOS)
    for _ in range(7):
        run, _ = continuous.advance(graphs, run, cfg, BOS, EOS)
    joined = continuous.join(run, continuous.start(graphs, src_of(SOURCES[1:2]), [1], cfg, BOS), PAD)
    assert all(a is b for a, b in zip(joined.cache.self_k + joined.cache.self_v, run.cache.self_k + run.cache.self_v))
    assert joined.cache.order.tolist() == run.cache.order.tolist() + [0, 0]
    slots = joined.tokens.shape[1]
    for cut in (slots // 4 - 1, slots // 4 + 1):
        later = replace(joined, starts=torch.tensor([cut, cut + 1]))
        kept = slots - cut if on == "search graph" or 4 * cut >= slots else slots
        trimmed = continuous.trim(later, PAD)
        assert trimmed.tokens.shape[1] == kept and trimmed.cache.length == later.cache.length - (slots - kept)
        assert all(a is b for a, b in zip(trimmed.cache.self_k, later.cache.self_k))  # no copy
        if on == "search graph":
            after, _ = continuous.advance(graphs, trimmed, cfg, BOS, EOS)
            assert after.cache.self_k[0].shape[2] == kept and after.cache.front == 0
