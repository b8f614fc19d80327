"""The inference engines (issue 33): relmt's searches on the graphs exported to ONNX Runtime and compiled by
AOTInductor decode as eager relmt does, token for token, with scores within 1e-4, in every position mode and
norm, on random models and on a trained one, with a forced prefix and constraints too (issue 60); one CLI and
one API choose the engine.

An AOTInductor compile takes 20-40 s a graph, so make test compiles the trained per-head model (in float32 and in
int8); the CLI's aoti case (the CLI itself runs with onnx), the eleven random configurations and relmt-export
format=aoti are marked exhaustive, a sweep
make test leaves out (make test-exhaustive runs it; every position mode goes through the graphs eagerly in
tests/test_search_graph.py and tests/test_continuous.py). t5 left make test when int8 joined it, to keep make test
under 15 minutes on 2 cores, and the CLI's aoti case when the device lane did. The trained model is trained once
for all the workers (tests/tiny_checkpoints.py: shared_tiny), and its compiles run first (the `first` marker)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import zipfile
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from relmt.config import DecodeConfig, EosCandidates, Norm, PosKind
from relmt.data.tokenizer import BOS_ID, EOS_ID, PAD_ID
from relmt.decode import continuous
from relmt.decode.translator import Translator
from relmt.errors import UserError
from relmt.export.aoti import AotiModel, compile_threads, export_aoti
from relmt.export.graphs import GRAPHS_VERSION
from relmt.export.onnx import OnnxModel, export_onnx
from tests.tiny_checkpoints import SENTENCES, TOY, model_config, random_model, shared_tiny, toy_tokenizer

pytest.importorskip("onnxruntime")
ENGINES = {"onnx": lambda model, path: OnnxModel(export_onnx(model, path), threads=1),
           "aoti": lambda model, path: AotiModel(export_aoti(model, path))}

CASES = {
    "abs-pre": {"positions": PosKind.abs},
    "abs-post": {"positions": PosKind.abs, "norm": Norm.post},
    "rel-per-head": {"positions": PosKind.rel},
    "rel-shared-post": {"positions": PosKind.rel, "relative_share_heads": True, "norm": Norm.post},
    "both": {"positions": PosKind.both},
    "keys-only": {"positions": PosKind.rel, "relative_values": False},
    "values-only": {"positions": PosKind.rel, "relative_keys": False},
    "none": {"positions": PosKind.none},
    "rope": {"positions": PosKind.rope},
    "alibi": {"positions": PosKind.alibi},
    "t5": {"positions": PosKind.t5},
}
DECODE = DecodeConfig(beam=4, nbest=4, lenpen=0.6, max_len_a=1.0, max_len_b=6)


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    from relmt.data.tokenizer import Tokenizer

    return Tokenizer(toy_tokenizer(tmp_path_factory.mktemp("spm")))


def exhaustive_unless(keep: bool):
    return () if keep else (pytest.mark.exhaustive,)


@pytest.mark.parametrize("engine,case", [pytest.param(e, c, marks=exhaustive_unless(e == "onnx"))
                                         for e in ENGINES for c in CASES])
def test_the_engine_decodes_as_eager_relmt(engine, case, tokenizer, tmp_path):
    model = random_model(model_config(**CASES[case]), tokenizer.vocab_size, seed=3).eval()
    eager = Translator(model, tokenizer, DECODE, torch.device("cpu"))
    other = Translator(ENGINES[engine](model, tmp_path / engine), tokenizer, DECODE, torch.device("cpu"))
    # max_sentences=1: a sentence alone, 4 rows a step, which aoti's search_small.pt2 runs (relmt/export/aoti.py)
    forced = {"prefixes": ["the dog"] + [""] * (len(SENTENCES) - 1),  # issue 60: off the fused search step
              "constraints": [["cat", "sat"]] + [[]] * (len(SENTENCES) - 2) + [["bird"]], "ordered": True}
    for options in ({}, {"eos_candidates": EosCandidates.fairseq, "beam": 2, "nbest": 2}, {"beam": 1, "nbest": 1},
                    {"sampling": True, "beam": 3, "nbest": 3, "topk": 5}, {"max_sentences": 1}, forced):
        mine, theirs = eager.hypotheses(SENTENCES, **options), other.hypotheses(SENTENCES, **options)
        for a, b in zip(mine, theirs):
            assert [h.tokens for h in a] == [h.tokens for h in b], (case, options)
            assert [h.score for h in a] == pytest.approx([h.score for h in b], abs=1e-4)


def package_code(path: Path) -> str:
    """The C++ source inside an AOTInductor package."""
    with zipfile.ZipFile(path) as package:
        return "".join(package.read(n).decode(errors="ignore") for n in package.namelist() if n.endswith(".cpp"))


# --- a trained model with per-head tables, which CTranslate2 cannot hold ----------------------------------

@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> Path:
    """The tiny preset (per-head relative tables) trained for 300 updates, once for all workers, with its engine
    artefacts."""
    return shared_tiny(tmp_path_factory, "tiny_per_head")


# the tests that compile the trained model for engine=aoti, or use that compile, run first (tests/conftest.py), in
# this order: the first compiles it, and the next ones on the same worker find it made
@pytest.mark.parametrize("engine", [pytest.param("onnx"), pytest.param("aoti", marks=pytest.mark.first)])
def test_the_engine_decodes_a_trained_per_head_model_as_eager_relmt(engine, trained):
    from relmt import checkpoint

    model = checkpoint.load(trained)["config"]["model"]
    assert (model["positions"], model["relative_share_heads"]) == ("rel", False)
    eager = Translator.from_checkpoint(trained, device="cpu")
    other = Translator.from_checkpoint(trained, engine=engine)
    for options in ({"beam": 4, "nbest": 4}, {"beam": 4, "lenpen": 1.0, "length_norm": "power",
                                              "eos_candidates": EosCandidates.fairseq}):
        mine, theirs = eager.hypotheses(TOY, **options), other.hypotheses(TOY, **options)
        for sentence, a, b in zip(TOY, mine, theirs):
            assert [h.tokens for h in a] == [h.tokens for h in b], (sentence, options)
            assert [h.score for h in a] == pytest.approx([h.score for h in b], abs=1e-4)
    assert max(len(h[0].tokens) for h in mine) < 20  # every output ended with EOS
    if engine == "aoti":  # compiled in a one-thread worker, for the machine's cores all the same
        [folder] = (trained.parent / f"{trained.name}.engines").glob("aoti-*")
        assert json.loads((folder / "aoti.json").read_text())["threads"] == compile_threads()
        # a sentence at a time on one thread, with a step limit of at most LOOP_SLOTS, the whole search is one call of
        # loop.pt2 (issue 76 §1), with the same hypotheses; on two threads, none
        threads = torch.get_num_threads()
        torch.set_num_threads(2)
        assert other.model.loop_rows == 0
        torch.set_num_threads(1)
        assert other.model.loop_rows == 4
        whole, calls = other.model.whole_search, []
        other.model.whole_search = lambda *args: calls.append(args[2]) or whole(*args)
        short = {"max_len_a": 1.0, "max_len_b": 6}
        for options in ({"beam": 4, "nbest": 4, **short}, {"beam": 2, "nbest": 2, "lenpen": 1.0, "length_norm": "power",
                                                           "eos_candidates": EosCandidates.fairseq, "min_len": 3,
                                                           **short}):
            mine, theirs = eager.hypotheses(TOY, **options), other.hypotheses(TOY, max_sentences=1, **options)
            for sentence, a, b in zip(TOY, mine, theirs):
                assert [h.tokens for h in a] == [h.tokens for h in b], (sentence, options)
                assert [h.score for h in a] == pytest.approx([h.score for h in b], abs=1e-4)
        assert calls == [4] * len(TOY) + [2] * len(TOY)
        del other.model.whole_search
        torch.set_num_threads(threads)
    # continuous batching (relmt-serve's, issue 62 §3): sentences that join the engine's running search at steps
    # 0, 1 and 4 get what eager relmt gives each decoded alone
    cfg = replace(eager.decode, beam=4, nbest=4)
    assert continuous.supports(other.model, cfg)
    ids = [x + [EOS_ID] for x in eager.tokenizer.encode(TOY)]
    run, out, schedule = None, {}, {0: [0, 1], 1: [2], 4: list(range(3, len(TOY)))}
    for step in range(200):
        if step in schedule:
            src = torch.full((len(schedule[step]), max(len(ids[i]) for i in schedule[step])), PAD_ID)
            for row, i in enumerate(schedule[step]):
                src[row, : len(ids[i])] = torch.tensor(ids[i])
            run = continuous.join(run, continuous.start(other.model, src, schedule[step], cfg, BOS_ID), PAD_ID)
        if run is not None:
            run, finished = continuous.advance(other.model, run, cfg, BOS_ID, EOS_ID)
            out.update(finished)
        if len(out) == len(TOY):
            break
    for i, want in enumerate(eager.hypotheses(TOY, beam=4, nbest=4)):
        assert [h.tokens for h in out[i]] == [h.tokens for h in want], TOY[i]
        assert [h.score for h in out[i]] == pytest.approx([h.score for h in want], abs=1e-4)


@pytest.mark.first
def test_aoti_packages_run_through_their_c_abi_without_the_gil_and_as_torchs_binding_runs_them(trained):
    """relmt/export/aoti.py's released_call (issue 70): the engine calls each compiled model through its library's
    C ABI, which gives the same outputs as torch's binding of the package and lets other Python threads run during the
    call (relmt-serve's HTTP side while a step runs); torch's binding holds the GIL throughout."""
    import threading
    import time

    from relmt.export.aoti import released_call

    engine = Translator.from_checkpoint(trained, engine="aoti").model
    [folder] = (trained.parent / f"{trained.name}.engines").glob("aoti-*")
    assert engine.encoder.__qualname__ == released_call.__qualname__ + ".<locals>.call"
    package = torch._inductor.aoti_load_package(str(folder / "encoder.pt2"))
    src = torch.randint(5, 40, (64, 120))
    src[:, -1] = EOS_ID
    for a, b in zip(engine.encoder(src), package.loader.boxed_run([src]), strict=True):
        assert torch.equal(a, b)
    ticks, calls, stop = [], [], threading.Event()

    def spin() -> None:  # Python that runs only while it holds the GIL
        while not stop.is_set():
            ticks.append(time.perf_counter())

    thread = threading.Thread(target=spin)
    thread.start()
    def inside() -> bool:  # a tick of the other thread well within a call
        return any(a + 0.1 * (b - a) < t < b - 0.1 * (b - a) for t in list(ticks) for a, b in calls)

    try:  # up to 50 calls: on a busy machine the OS may not run the other thread during every call
        for _ in range(50):
            start = time.perf_counter()
            engine.encoder(src)
            calls.append((start, time.perf_counter()))
            if inside():
                break
    finally:
        stop.set()
        thread.join()
    assert inside(), "no Python ran in another thread while the compiled model ran"


# --- a compiled model called wrongly, or failing, says so; an export of other graphs is refused (issue 74 §3) ---

ROOT = Path(__file__).resolve().parents[1]
CALL_ENCODER = """
import sys
from pathlib import Path

import torch

from relmt.export.aoti import released_call

encoder = released_call(Path(sys.argv[1]))
src = torch.full((1, 3), 5, dtype=torch.long)
try:
    encoder(src, src) if sys.argv[2] == "count" else encoder(src.float())
except RuntimeError as e:
    print(e)
"""


def aoti_folder(trained: Path) -> Path:
    """The trained model's engine=aoti artefact (made once per module: the tests above have made it)."""
    Translator.from_checkpoint(trained, engine="aoti")
    [folder] = (trained.parent / f"{trained.name}.engines").glob("aoti-*")
    return folder


def call_encoder(folder: Path, how: str) -> str:
    """What the released call of the artefact's encoder.pt2 raises when given two inputs (how="count") or a float
    source (how="dtype"), in a process of its own: a call that aborts the process (as another count did, in the
    container's C++) must not take pytest with it. AOTI_RUNTIME_CHECK_INPUTS=1 has the compiled code check its
    inputs' dtypes and sizes, so that a wrong dtype fails inside the compiled model."""
    env = os.environ | {"AOTI_RUNTIME_CHECK_INPUTS": "1"}
    proc = subprocess.run([sys.executable, "-c", CALL_ENCODER, str(folder / "encoder.pt2"), how], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, f"exit status {proc.returncode} (negative: killed by that signal): {proc.stderr}"
    return proc.stdout.strip()


@pytest.mark.first
def test_an_aoti_package_given_another_number_of_inputs_raises_instead_of_aborting(trained):
    """The container checks the input count outside its own error handling: another count aborted the process
    (SIGABRT, "expected inputs vector size to be 1, but got 2"). relmt's call checks it first and raises."""
    message = call_encoder(aoti_folder(trained), "count")
    assert "encoder.pt2: the compiled model takes 1 inputs, and was given 2" in message, message
    assert "export it again" in message


@pytest.mark.first
def test_a_failing_aoti_package_says_why(trained):
    """The reason a compiled model failed, which AOTInductor keeps (AOTInductorGetLastError), is in the exception,
    not only on stderr."""
    message = call_encoder(aoti_folder(trained), "dtype")
    assert "encoder.pt2: the compiled model failed" in message and "unmatched dtype" in message, message


@pytest.mark.first
def test_an_aoti_export_of_other_graphs_is_refused_as_it_loads(trained, tmp_path):
    """An export compiled from older graphs (before GRAPHS_VERSION 6 the search graph took 17 inputs, the cache
    stacked; now 15 and each layer's keys and values) is
    refused by AotiModel with what to do, not run until a call fails: by the graphs' version aoti.json records,
    and, in an export made before aoti.json recorded it, by the inputs and outputs its packages take and give."""
    folder, old = aoti_folder(trained), tmp_path / "old"
    old.mkdir()
    for name in ("encoder.pt2", "step.pt2", "search.pt2"):
        shutil.copy(folder / name, old / name)
    meta = json.loads((folder / "aoti.json").read_text())
    (old / "aoti.json").write_text(json.dumps(meta | {"graphs": GRAPHS_VERSION - 1}))
    with pytest.raises(UserError, match=f"compiled from version {GRAPHS_VERSION - 1} of relmt's graphs, and this "
                                        f"relmt's are version {GRAPHS_VERSION} .*: export it again"):
        AotiModel(old)
    unrecorded = {k: v for k, v in meta.items() if k != "graphs"}  # made before aoti.json recorded the version
    (old / "aoti.json").write_text(json.dumps(unrecorded))
    assert AotiModel(old).run_search is not None  # this relmt's packages: they take and give what relmt's graphs do
    shutil.copy(folder / "step.pt2", old / "search.pt2")  # a search graph that takes other inputs than relmt's
    cache = 2 * meta["layers"]  # each layer's self-attention keys and values, in and out (GRAPHS_VERSION 6)
    with pytest.raises(UserError, match=rf"search.pt2: the compiled model takes {6 + cache} inputs and gives "
                                        rf"{1 + cache} outputs, and this relmt's search graph takes {15 + cache} and "
                                        rf"gives {6 + cache}: .*export it again"):
        AotiModel(old)
    assert meta["graphs"] == GRAPHS_VERSION  # what an export records now


@pytest.mark.slow
@pytest.mark.first
def test_int8_on_engine_aoti_runs_int8_products_and_keeps_the_translations(trained):
    """engine=aoti quantization=int8 (relmt/export/quantize.py; issue 62): the compiled graphs multiply with int8
    GEMMs, and a trained model translates the toy sentences nearly as in float32 (a floor on BLEU against the
    float32 outputs, the int8 weights' rounding being all that differs)."""
    import sacrebleu

    eager = Translator.from_checkpoint(trained, device="cpu")
    int8 = Translator.from_checkpoint(trained, engine="aoti", quantization="int8")
    [folder] = (trained.parent / f"{trained.name}.engines").glob("aoti_int8-*")
    # one sentence's graph, traced at few rows without the GEMM template (which takes no int8 operands)
    assert "_int_mm" in package_code(folder / "search_small.pt2")
    assert "_int_mm" in package_code(folder / "step.pt2")  # int8 products, not float32 ones
    sentences = TOY * 2 + SENTENCES
    ours, theirs = eager.translate(sentences, beam=4), int8.translate(sentences, beam=4)
    assert sacrebleu.corpus_bleu(theirs, [ours]).score >= 70, list(zip(ours, theirs))


# --- one CLI and one API over every engine (issue 33 §2) -------------------------------------------------

def test_an_ensemble_on_the_onnx_engine_decodes_as_on_torch(tmp_path, capsys):
    """Two checkpoints on engine=onnx: each exported once, mixed by relmt's Ensemble as on engine=torch;
    ctranslate2, which runs its own search, refuses an ensemble with the reason."""
    from relmt.cli.common import guarded
    from relmt.cli.translate import _translate
    from tests.tiny_checkpoints import write_checkpoint

    spm = toy_tokenizer(tmp_path)
    cks = [write_checkpoint(tmp_path / f"run{i}", "model.pt", spm, seed=i, model=model_config()) for i in (1, 2)]
    torch_, onnx = (Translator.from_checkpoints(cks, engine=e) for e in ("torch", "onnx"))
    options = {"beam": 4, "nbest": 4}
    for a, b in zip(torch_.hypotheses(SENTENCES, **options), onnx.hypotheses(SENTENCES, **options)):
        assert [h.tokens for h in a] == [h.tokens for h in b]
        assert [h.score for h in a] == pytest.approx([h.score for h in b], abs=1e-4)
    assert all((ck.parent / "model.pt.engines").is_dir() for ck in cks)
    assert guarded("relmt-translate", _translate, [f"checkpoint=[{cks[0]},{cks[1]}]", "engine=ctranslate2"]) == 2
    assert "engine=ctranslate2 decodes one checkpoint (its own search" in capsys.readouterr().err


@pytest.mark.parametrize("graphs", [pytest.param("onnx"), pytest.param("aoti", marks=pytest.mark.exhaustive)])
def test_engines_from_the_cli_and_the_api(tmp_path, capsys, caplog, graphs):
    """engine=onnx (and in the exhaustive sweep engine=aoti, whose compile takes minutes on one thread; make test
    compiles aoti for the trained per-head model and int8) decode what engine=torch does, from an export made once
    beside the checkpoint and reused;
    engine=ctranslate2 converts a shared-table model once and translates, and refuses per-head tables with the
    reason; reference scoring stays relmt's; relmt-export format=onnx writes what OnnxModel reads."""
    import logging

    from relmt.cli.common import guarded
    from relmt.cli.translate import _translate
    from relmt.export.engines import Engine, engine_of
    from tests.tiny_checkpoints import DECODE, write_checkpoint

    spm = toy_tokenizer(tmp_path)
    ck = write_checkpoint(tmp_path / "run", "model.pt", spm, seed=5, model=model_config(relative_share_heads=True))
    src = tmp_path / "in.txt"
    src.write_text("".join(f"{s}\n" for s in SENTENCES))
    outputs = {}
    for engine in ("torch", graphs, graphs, "ctranslate2"):
        out = tmp_path / f"{engine}.txt"
        with caplog.at_level(logging.WARNING):
            caplog.clear()
            assert guarded("relmt-translate", _translate, [f"checkpoint={ck}", f"input={src}", f"output={out}",
                                                           f"engine={engine}", "beam=1"]) == 0, capsys.readouterr().err
        outputs.setdefault(engine, []).append((out.read_text(), caplog.text))
    assert outputs[graphs][0][0] == outputs["torch"][0][0]
    # CTranslate2's own search matches relmt's where the model gives <pad> and <s> no mass (tests/test_export.py);
    # this random one gives them some, so here it must only translate every line
    assert outputs["ctranslate2"][0][0].count("\n") == len(SENTENCES)
    assert f"engine={graphs}: exporting" in outputs[graphs][0][1] and "exporting" not in outputs[graphs][1][1]
    assert sorted(p.name.split("-")[0] for p in (tmp_path / "run" / "model.pt.engines").iterdir()) == sorted([
        graphs, "ctranslate2"])
    api = Translator.from_checkpoint(ck, engine="onnx")
    assert api.translate(SENTENCES, beam=4) == Translator.from_checkpoint(ck).translate(SENTENCES, beam=4)
    assert [s.logprob for s in api.score(SENTENCES[:2], SENTENCES[:2])] == pytest.approx(
        [s.logprob for s in Translator.from_checkpoint(ck).score(SENTENCES[:2], SENTENCES[:2])])
    per_head = write_checkpoint(tmp_path / "head", "model.pt", spm, seed=5, model=model_config(), decode=DECODE)
    assert guarded("relmt-translate", _translate, [f"checkpoint={per_head}", f"input={src}",
                                                   "engine=ctranslate2"]) == 2
    assert "one a^K/a^V table per attention head" in capsys.readouterr().err
    assert not (tmp_path / "head" / "model.pt.engines").exists()
    assert guarded("relmt-translate", _translate, [f"checkpoint={ck}", f"input={src}", "engine=tensorrt"]) == 2
    assert "engine=tensorrt: must be one of torch, onnx, aoti, ctranslate2" in capsys.readouterr().err
    assert engine_of("onnx") == Engine.onnx
    from relmt.cli.export import _export

    assert guarded("relmt-export", _export, [f"checkpoint={ck}", f"output={tmp_path / 'exported'}", "format=onnx"]) == 0
    exported = Translator(OnnxModel(tmp_path / "exported"), api.tokenizer, api.decode, torch.device("cpu"))
    assert exported.translate(SENTENCES, beam=4) == api.translate(SENTENCES, beam=4)
    assert (tmp_path / "exported" / "sentencepiece.model").is_file()


@pytest.mark.exhaustive
def test_relmt_export_format_aoti(tmp_path):
    from relmt.cli.common import guarded
    from relmt.cli.export import _export
    from tests.tiny_checkpoints import write_checkpoint

    ck = write_checkpoint(tmp_path / "run", "model.pt", toy_tokenizer(tmp_path), seed=5, model=model_config())
    assert guarded("relmt-export", _export, [f"checkpoint={ck}", f"output={tmp_path / 'aoti'}", "format=aoti"]) == 0
    api = Translator.from_checkpoint(ck)
    exported = Translator(AotiModel(tmp_path / "aoti"), api.tokenizer, api.decode, torch.device("cpu"))
    assert exported.translate(SENTENCES, beam=4) == api.translate(SENTENCES, beam=4)
    assert {p.name for p in (tmp_path / "aoti").iterdir()} >= {"encoder.pt2", "step.pt2", "search.pt2",
                                                               "sentencepiece.model"}
