"""The search step as one graph (issue 44 §7): relmt/export/graphs.py's SearchGraph runs a decoder step and
relmt.decode.beam.beam_step with the settings as tensors, so that an engine leaves Python once per step. Run
eagerly here (no compiler: tests/test_engines.py compiles it with AOTInductor), a beam search through it must
give what beam_search gives on the model itself, for every setting the graph takes as an input."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from relmt.config import PosKind
from relmt.data.tokenizer import BOS_ID, EOS_ID, PAD_ID
from relmt.decode.beam import beam_search
from relmt.export.graphs import (
    SEARCH_INPUTS,
    SEARCH_OUTPUTS,
    STEP_INPUTS,
    EncoderGraph,
    GraphModel,
    SearchGraph,
    StepGraph,
    nest,
    shape_of,
)
from tests.tiny_checkpoints import model_config, random_model

VOCAB = 40


class EagerGraphs(GraphModel):
    """An engine whose graphs run uncompiled, counting the calls of each."""

    def __init__(self, model) -> None:
        super().__init__(shape_of(model))
        self.graphs = {"encoder": EncoderGraph(model), "step": StepGraph(model), "search": SearchGraph(model)}
        self.calls = {name: 0 for name in self.graphs}

    def call(self, name: str, *inputs):
        self.calls[name] += 1
        names = {"encoder": ("src",), "step": STEP_INPUTS, "search": SEARCH_INPUTS}[name]
        with torch.no_grad():  # the flat inputs an engine takes, grouped as the graph takes them
            return tuple(self.graphs[name](*nest(inputs, names, self.layers)))

    def run_encoder(self, src):
        return self.call("encoder", src)

    def run_step(self, *inputs):
        return self.call("step", *inputs)

    def run_search(self, *inputs):
        return self.call("search", *inputs)


def sources() -> torch.Tensor:
    torch.manual_seed(0)
    src = torch.randint(4, VOCAB, (3, 7))
    src[1, 4:] = PAD_ID  # sentences of different lengths, so that they finish at different steps
    src[2, 2:] = PAD_ID
    src[1, 3] = src[2, 1] = src[0, 6] = EOS_ID
    return src


SETTINGS = {
    "t2t": {},
    "fairseq": {"eos_candidates": "fairseq", "beam": 2, "nbest": 2},
    "greedy": {"beam": 1, "nbest": 1, "early_stop": True, "eos_candidates": "fairseq"},
    "power, early stop, min_len": {"lenpen": 1.0, "length_norm": "power", "early_stop": True, "min_len": 3},
    "lenpen 0, a long limit": {"lenpen": 0.0, "max_len_a": 2.0, "max_len_b": 3},
}


@pytest.mark.parametrize("positions", [PosKind.rel, PosKind.abs, PosKind.t5])
@pytest.mark.parametrize("setting", list(SETTINGS))
def test_a_search_through_the_search_graph_equals_beam_search(positions, setting):
    model = random_model(model_config(positions=positions), VOCAB, seed=1)
    options = {"beam": 4, "nbest": 4, "lenpen": 0.6, "max_len_a": 1.0, "max_len_b": 4} | SETTINGS[setting]
    mine = beam_search(model, sources(), bos_id=BOS_ID, eos_id=EOS_ID, **options)
    graphs = EagerGraphs(model)
    theirs = beam_search(graphs, sources(), bos_id=BOS_ID, eos_id=EOS_ID, **options)
    assert graphs.calls["search"] > 0 and graphs.calls["step"] == 0  # one call per step, no other
    for a, b in zip(mine, theirs, strict=True):
        assert [h.tokens for h in a] == [h.tokens for h in b], setting
        assert [h.score for h in a] == pytest.approx([h.score for h in b], abs=1e-5)
    assert sum(map(len, mine)) == len(mine) * options["nbest"]  # full pools were compared


def test_other_ids_than_the_graphs_go_step_by_step():
    """BOS and EOS are constants of the search graph: a search with other ids decodes through the step graph
    and beam_step in Python, and still equals beam_search."""
    model = random_model(model_config(), VOCAB, seed=1)
    options = {"beam": 3, "nbest": 3, "max_len_a": 1.0, "max_len_b": 4, "bos_id": BOS_ID, "eos_id": EOS_ID + 5}
    graphs = EagerGraphs(model)
    mine, theirs = beam_search(model, sources(), **options), beam_search(graphs, sources(), **options)
    assert graphs.calls["search"] == 0 and graphs.calls["step"] > 0
    assert [[h.tokens for h in a] for a in mine] == [[h.tokens for h in b] for b in theirs]


def test_an_aoti_export_without_the_search_graph_searches_in_python(tmp_path, monkeypatch):
    """A `relmt-export format=aoti` folder made before search.pt2 existed still loads, and its searches run
    beam_step in Python; with search.pt2 the engine takes relmt's ids (no compiler: the packages are stand-ins)."""
    import json

    import torch._inductor

    from relmt.decode.beam import Rules
    from relmt.export.aoti import AotiModel

    model = random_model(model_config(), VOCAB, seed=1)
    monkeypatch.setattr(torch._inductor, "aoti_load_package", lambda path: (lambda *args: args))
    (tmp_path / "aoti.json").write_text(json.dumps(shape_of(model) | {"torch": torch.__version__}))
    for name in ("encoder.pt2", "step.pt2"):
        (tmp_path / name).write_bytes(b"package")
    rules = Rules(EOS_ID, torch.tensor([PAD_ID, BOS_ID]), 0, 0.6, "gnmt", True, False)
    assert AotiModel(tmp_path).run_search is None and not AotiModel(tmp_path).searches(rules)
    (tmp_path / "search.pt2").write_bytes(b"package")
    engine = AotiModel(tmp_path)
    assert engine.searches(rules) and not engine.searches(Rules(EOS_ID + 1, *list(vars(rules).values())[1:]))


def test_an_aoti_export_runs_search_small_for_steps_of_few_rows(tmp_path, monkeypatch):
    """With search_small.pt2 beside search.pt2 (the same graph, autotuned for few rows), a step of at most
    SMALL_ROWS hypotheses (sentences x beams) runs the small package and a larger one search.pt2; an export
    without it runs search.pt2 at every size (no compiler: the packages are stand-ins that name themselves)."""
    import json

    import torch._inductor

    from relmt.export.aoti import SMALL_ROWS, AotiModel

    model = random_model(model_config(), VOCAB, seed=1)
    monkeypatch.setattr(torch._inductor, "aoti_load_package", lambda path: (lambda *args: (Path(path).name,)))
    (tmp_path / "aoti.json").write_text(json.dumps(shape_of(model) | {"torch": torch.__version__}))
    for name in ("encoder.pt2", "step.pt2", "search.pt2"):
        (tmp_path / name).write_bytes(b"package")

    def package(sentences: int, beams: int) -> str:
        return AotiModel(tmp_path).run_search(torch.zeros(sentences, beams, 3, dtype=torch.long))[0]

    assert package(1, 4) == package(5, 4) == "search.pt2"
    (tmp_path / "search_small.pt2").write_bytes(b"package")
    assert SMALL_ROWS == 4
    assert [package(1, 4), package(2, 2), package(1, 1), package(2, 4), package(1, 5)] == ["search_small.pt2"] * 3 + [
        "search.pt2"] * 2
    assert package(5, 4) == package(32, 4) == "search.pt2"


def test_the_graphs_take_the_cache_one_tensor_per_layer_and_flat():
    """Since GRAPHS_VERSION 6 the step and search graphs take and give each layer's self-attention keys and values
    apart (no stacked copy of them at every step; docs/results/engines/cache_copies.md). An engine's flat inputs
    group back into the graph's arguments (`nest`, `flat`'s inverse), and scripts/bench/cache_copies.py's `Stacked`,
    the search graph with the stacked cache it replaced, gives the same step, bit for bit."""
    import importlib.util

    from relmt.export.graphs import flat, flat_names, search_examples

    model = random_model(model_config(positions=PosKind.rel), VOCAB, seed=1).eval()
    layers = len(model.decoder_layers)
    args, _ = search_examples(model, "many")
    inputs = flat(args)
    assert len(inputs) == len(SEARCH_INPUTS) - 2 + 2 * layers == len(flat_names(SEARCH_INPUTS, layers))
    assert flat_names(SEARCH_INPUTS, layers)[4:4 + layers] == [f"self_k_{i}" for i in range(layers)]
    grouped = nest(inputs, SEARCH_INPUTS, layers)
    assert all(a is b for x, y in zip(args, grouped) for a, b in zip(flat([x]), flat([y])))
    script = Path(__file__).parents[1] / "scripts/bench/cache_copies.py"
    spec = importlib.util.spec_from_file_location("cache_copies", script)
    cache_copies = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(cache_copies)
    stacked = (*args[:4], torch.stack(args[4]), torch.stack(args[5]), *args[6:])  # the same state, stacked
    with torch.no_grad():
        apart, together = SearchGraph(model)(*grouped), cache_copies.Stacked(model)(*stacked)
    assert len(apart) == len(SEARCH_OUTPUTS) - 2 + 2 * layers
    assert torch.equal(torch.stack(apart[5:5 + layers]), together[5]) and torch.equal(apart[0], together[0])
    assert all(torch.equal(a, b) for a, b in zip(apart[:5], together[:5]))


def test_the_search_graph_leaves_out_the_front_slots_cut_from_its_history():
    """Since GRAPHS_VERSION 7 the search graph takes a cache longer than its history (continuous batching's cut,
    relmt/decode/continuous.py `trim`, shortens the history and the pools alone): it leaves the cache's front slots
    out of the copy it makes, and gives bit for bit the step of the cache cut beforehand, whatever those slots hold."""
    from relmt.export.graphs import flat, search_examples

    model = random_model(model_config(positions=PosKind.rel), VOCAB, seed=1).eval()
    args, _ = search_examples(model, "many")
    t = args[0].shape[2] - 1  # the history's slots, one fewer than the cache's
    cut = [[x[:, :, -t:].contiguous() for x in xs] for xs in (args[4], args[5])]
    junk = [[torch.cat((torch.full_like(x[:, :, :3], float("nan")), x), dim=2) for x in xs] for xs in cut]
    with torch.no_grad():
        want = SearchGraph(model)(*args[:4], *cut, *args[6:])
        for cache in (junk, [args[4], args[5]]):  # 3 slots of NaN before them, or the example's own 1 slot
            got = SearchGraph(model)(*args[:4], *cache, *args[6:])
            assert all(torch.equal(a, b) for a, b in zip(flat(got), flat(want)))
