"""The engines' artefacts follow the code and the libraries that made them (issue 42 §3), and relmt-export
refuses a quantization its format cannot write (issue 42 §4).

- the key of `<checkpoint>.engines/<engine>-<key16>` covers the checkpoint's checksum, torch, the engine's
  library (onnx/onnxscript/onnxruntime, or ctranslate2) and relmt's own graphs/converter version: a change
  in any rebuilds, with one log line naming what changed (an aoti package of another torch included);
- an older artefact of an engine goes once a newer one is in place and it has not been used for a while;
- artefacts and relmt-export output get the permissions of the user's umask, not mkdtemp's 0700;
- an unwritable `.engines` folder falls back to the cache directory;
- CTranslate2 converts the very weights whose checksum names the artefact.

The key, rebuild and prune logic run on stand-in writers (no export); the permission and CTranslate2 tests
export a tiny model for real (seconds)."""

from __future__ import annotations

import json
import logging
import os
import shutil
import stat
import sys
import time
from pathlib import Path

import pytest
import torch

from relmt import checkpoint
from relmt.cli.common import guarded
from relmt.cli.export import _export
from relmt.export import engines
from relmt.export.engines import Engine
from tests.tiny_checkpoints import SENTENCES, model_config, random_model, toy_tokenizer, write_checkpoint

CHECKSUM_A, CHECKSUM_B = "a" * 64, "b" * 64


@pytest.fixture(scope="module")
def spm(tmp_path_factory) -> Path:
    return toy_tokenizer(tmp_path_factory.mktemp("spm"))


@pytest.fixture
def model(spm):
    from relmt.data.tokenizer import Tokenizer

    return random_model(model_config(relative_share_heads=True), Tokenizer(spm).vocab_size, seed=3)


@pytest.fixture
def stand_in(monkeypatch):
    """graph_model's export and loader replaced: write_graphs writes a marker file and counts its calls, and
    the 'loaded model' is the folder it was given."""
    calls = []

    def write(engine, model, directory, quantization="float32"):
        calls.append(Path(directory))
        (Path(directory) / "graph.txt").write_text(f"{engine.value} {torch.__version__}\n")
        return directory

    monkeypatch.setattr(engines, "write_graphs", write)
    import relmt.export.onnx as onnx_module

    monkeypatch.setattr(onnx_module, "OnnxModel", lambda directory, threads=0: Path(directory))
    return calls


def siblings(checkpoint_path: Path, engine: str) -> list[str]:
    folder = checkpoint_path.parent / f"{checkpoint_path.name}.engines"
    return sorted(p.name for p in folder.glob(f"{engine}-*")) if folder.is_dir() else []


def age(path: Path, seconds: float) -> None:
    """Make `path` look unused for `seconds`."""
    then = time.time() - seconds
    os.utime(path, (then, then))


# --- 1. the key covers what the artefact depends on ------------------------------------------------------

def test_the_key_covers_torch_the_engine_library_and_relmts_graphs(tmp_path, monkeypatch):
    from relmt.export import graphs

    ck = tmp_path / "best.pt"
    ck.write_bytes(b"stand-in")
    names = {}
    for engine in (Engine.onnx, Engine.aoti, Engine.ctranslate2):
        names[engine] = engines.artefact_dir(ck, engine, CHECKSUM_A).name
        assert names[engine].startswith(f"{engine.value}-") and len(names[engine]) == len(engine.value) + 17
        assert engines.artefact_dir(ck, engine, CHECKSUM_A).name == names[engine]  # stable
        assert engines.artefact_dir(ck, engine, CHECKSUM_B).name != names[engine]  # the checkpoint's bytes
    with monkeypatch.context() as m:
        m.setattr(torch, "__version__", "2.0.0+elsewhere")
        for engine in Engine:
            if engine != Engine.torch:
                assert engines.artefact_dir(ck, engine, CHECKSUM_A).name != names[engine], engine
    with monkeypatch.context() as m:
        m.setattr(graphs, "GRAPHS_VERSION", graphs.GRAPHS_VERSION + 1)
        assert engines.artefact_dir(ck, Engine.onnx, CHECKSUM_A).name != names[Engine.onnx]
        assert engines.artefact_dir(ck, Engine.aoti, CHECKSUM_A).name != names[Engine.aoti]
    real = engines.library_version
    for library, engine in (("onnxruntime", Engine.onnx), ("onnx", Engine.onnx), ("onnxscript", Engine.onnx),
                            ("ctranslate2", Engine.ctranslate2)):
        with monkeypatch.context() as m:
            m.setattr(engines, "library_version", lambda name, lib=library: "0.0.1" if name == lib else real(name))
            assert engines.artefact_dir(ck, engine, CHECKSUM_A).name != names[engine], library
            assert engines.artefact_dir(ck, Engine.aoti, CHECKSUM_A).name == names[Engine.aoti]


def test_graphs_version_is_documented_beside_the_graphs():
    text = (Path(engines.__file__).parent / "graphs.py").read_text()
    assert "GRAPHS_VERSION" in text and "bump" in text.lower()


def test_an_aoti_package_of_another_torch_is_rebuilt_with_one_log_line(tmp_path, monkeypatch, model, caplog):
    """Not the dead-end "compiled with torch X ... export it again": the key holds torch's version, so the
    package is compiled again for this torch, and the log says why in one line."""
    import torch._inductor

    import relmt.export.aoti as aoti
    from relmt.export.graphs import shape_of

    def compile_(model, directory):  # what export_aoti writes, without the compiler
        directory = Path(directory)
        for name in ("encoder.pt2", "step.pt2", "search.pt2"):
            (directory / name).write_bytes(b"package")
        (directory / "aoti.json").write_text(json.dumps(shape_of(model) | {"torch": torch.__version__}))
        return directory

    compiled = []
    monkeypatch.setattr(aoti, "export_aoti", lambda model, directory, quantization="float32", kept_in=None:
                        compiled.append(quantization) or compile_(model, directory))
    monkeypatch.setattr(torch._inductor, "aoti_load_package", lambda path: (lambda *args: args))
    ck = tmp_path / "best.pt"
    ck.write_bytes(b"stand-in")
    with monkeypatch.context() as m:
        m.setattr(torch, "__version__", "2.0.0+old")
        engines.graph_model(Engine.aoti, model, ck, CHECKSUM_A)
    assert len(compiled) == 1
    caplog.set_level(logging.INFO, logger=engines.__name__)
    caplog.clear()
    loaded = engines.graph_model(Engine.aoti, model, ck, CHECKSUM_A)
    assert isinstance(loaded, aoti.AotiModel) and len(compiled) == 2
    why = [r.getMessage() for r in caplog.records if "exporting" in r.getMessage()]
    assert len(why) == 1 and "torch 2.0.0+old" in why[0] and torch.__version__ in why[0], caplog.text
    caplog.clear()
    engines.graph_model(Engine.aoti, model, ck, CHECKSUM_A)  # now made for this torch: reused, silently
    assert len(compiled) == 2 and "exporting" not in caplog.text


# --- 2. only the newest artefact per engine is kept ------------------------------------------------------

def test_an_older_artefact_goes_once_a_newer_one_is_built(tmp_path, stand_in, caplog):
    ck = tmp_path / "best.pt"
    ck.write_bytes(b"stand-in")
    first = engines.graph_model(Engine.onnx, None, ck, CHECKSUM_A)
    assert siblings(ck, "onnx") == [first.name]
    age(first, 3600)  # last used an hour ago
    caplog.set_level(logging.INFO, logger=engines.__name__)
    second = engines.graph_model(Engine.onnx, None, ck, CHECKSUM_B)  # best.pt replaced by training
    assert siblings(ck, "onnx") == [second.name] and not first.exists()
    assert any("the checkpoint changed" in r.getMessage() for r in caplog.records), caplog.text
    assert engines.graph_model(Engine.onnx, None, ck, CHECKSUM_B) == second and len(stand_in) == 2


def test_pruning_spares_what_may_be_in_use_and_other_engines(tmp_path, stand_in):
    ck = tmp_path / "best.pt"
    ck.write_bytes(b"stand-in")
    folder = tmp_path / "best.pt.engines"
    in_use = engines.graph_model(Engine.onnx, None, ck, CHECKSUM_A)  # used just now, e.g. by another process
    other = folder / "aoti-0123456789abcdef"
    other.mkdir()
    age(other, 3600)
    building = folder / ".onnx-0123456789abcdef.x1y2"  # another process's build in progress
    building.mkdir()
    dead = folder / ".onnx-fedcba9876543210.z9"  # a build killed a day ago
    dead.mkdir()
    age(dead, 2 * 86400)
    newest = engines.graph_model(Engine.onnx, None, ck, CHECKSUM_B)
    assert in_use.is_dir() and newest.is_dir() and other.is_dir() and building.is_dir()
    assert not dead.exists()
    age(in_use, 3600)
    engines.graph_model(Engine.onnx, None, ck, CHECKSUM_B)  # a later use clears what is no longer used
    assert siblings(ck, "onnx") == [newest.name] and other.is_dir()


# --- 3. permissions follow the umask ---------------------------------------------------------------------

@pytest.fixture
def umask_022():
    old = os.umask(0o022)
    yield
    os.umask(old)


def modes(root: Path) -> set[tuple[str, str]]:
    """('d' or 'f', octal permission bits) of root and everything under it."""
    found = {("d", oct(stat.S_IMODE(root.stat().st_mode)))}
    for path in root.rglob("*"):
        found.add(("d" if path.is_dir() else "f", oct(stat.S_IMODE(path.stat().st_mode))))
    return found


def test_artefacts_and_exports_get_the_umasks_permissions(tmp_path, spm, umask_022):
    """A real CTranslate2 artefact and real exports (an onnx artefact is made as relmt-export format=onnx is,
    by build_artefact: the next test checks one made by the stand-in writer)."""
    pytest.importorskip("onnxruntime")
    pytest.importorskip("ctranslate2")
    from relmt.decode.translator import Translator

    ck = write_checkpoint(tmp_path / "run", "best.pt", spm, seed=5, model=model_config(relative_share_heads=True))
    assert Translator.from_checkpoint(ck, engine="ctranslate2").translate(SENTENCES[:1], beam=1)
    for fmt in ("onnx", "ctranslate2"):
        assert guarded("relmt-export", _export, [f"checkpoint={ck}", f"output={tmp_path / fmt}", f"format={fmt}"]) == 0
    for root in (tmp_path / "run" / "best.pt.engines", tmp_path / "onnx", tmp_path / "ctranslate2"):
        assert modes(root) == {("d", "0o755"), ("f", "0o644")}, root


def test_an_onnx_artefact_gets_the_umasks_permissions(tmp_path, stand_in, umask_022):
    ck = tmp_path / "best.pt"
    ck.write_bytes(b"stand-in")
    made = engines.graph_model(Engine.onnx, None, ck, CHECKSUM_A)
    assert modes(made) == {("d", "0o755"), ("f", "0o644")}


# --- 4. an unwritable .engines folder falls back to the cache --------------------------------------------

def deny_writing(monkeypatch, folder: Path) -> None:
    """`folder` unwritable: by its mode where that binds, and as root (whom modes do not stop) by answering
    as the kernel would to a user: os.access says no and creating a folder in it fails."""
    folder.chmod(0o500)
    if os.geteuid() != 0:
        return
    import tempfile

    access, mkdtemp = os.access, tempfile.mkdtemp

    def no_access(path, mode, *args, **kwargs):
        if Path(path) == folder and mode & os.W_OK:
            return False
        return access(path, mode, *args, **kwargs)

    def no_mkdtemp(*args, dir=None, **kwargs):
        if dir is not None and Path(dir) == folder:
            raise PermissionError(13, "Permission denied", str(folder))
        return mkdtemp(*args, dir=dir, **kwargs)

    monkeypatch.setattr(os, "access", no_access)
    monkeypatch.setattr(tempfile, "mkdtemp", no_mkdtemp)


def test_an_unwritable_engines_folder_falls_back_to_the_cache(tmp_path, stand_in, monkeypatch, caplog):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    ck = tmp_path / "run" / "best.pt"
    ck.parent.mkdir()
    ck.write_bytes(b"stand-in")
    folder = tmp_path / "run" / "best.pt.engines"
    folder.mkdir()
    deny_writing(monkeypatch, folder)
    try:
        made = engines.graph_model(Engine.onnx, None, ck, CHECKSUM_A)
    finally:
        folder.chmod(0o755)
    assert made.is_dir() and (tmp_path / "cache" / "relmt") in made.parents
    assert not list(folder.iterdir())
    assert "is not writable" in caplog.text and str(made.parent) in caplog.text


def test_a_failed_write_beside_the_checkpoint_falls_back_to_the_cache(tmp_path, stand_in, monkeypatch):
    """os.access can say yes where writing fails (ACLs, root on NFS): the PermissionError then sends the
    artefact to the cache too."""
    import tempfile

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    ck = tmp_path / "best.pt"
    ck.write_bytes(b"stand-in")
    mkdtemp = tempfile.mkdtemp

    def refuse_beside(*args, dir=None, **kwargs):
        if dir is not None and Path(dir).name == "best.pt.engines":
            raise PermissionError(13, "Permission denied", str(dir))
        return mkdtemp(*args, dir=dir, **kwargs)

    monkeypatch.setattr(tempfile, "mkdtemp", refuse_beside)
    made = engines.graph_model(Engine.onnx, None, ck, CHECKSUM_A)
    assert made.is_dir() and (tmp_path / "cache" / "relmt") in made.parents


# --- 5. CTranslate2 converts the weights whose checksum names the artefact -------------------------------

def test_ctranslate2_converts_the_bytes_its_checksum_names(tmp_path, spm, monkeypatch):
    """best.pt replaced (by training) between reading its checksum and converting it: the artefact still holds
    the weights that checksum names."""
    pytest.importorskip("ctranslate2")
    from relmt.decode.translator import Translator
    from relmt.export.ctranslate2 import export

    ck = write_checkpoint(tmp_path / "run", "best.pt", spm, seed=5, model=model_config(relative_share_heads=True))
    original = tmp_path / "original.pt"
    shutil.copy(ck, original)
    newer = checkpoint.load(ck)
    newer.pop("checksum")
    newer["step"] = 7
    newer["model"] = {k: v + 0.5 if v.is_floating_point() else v for k, v in newer["model"].items()}
    load = checkpoint.load
    reads = []

    def load_then_replace(path, *args, **kwargs):
        payload = load(path, *args, **kwargs)
        reads.append(Path(path))
        if len(reads) == 1:
            checkpoint.save(newer, ck.parent, [ck.name])  # training writes a new best.pt
        return payload

    monkeypatch.setattr(checkpoint, "load", load_then_replace)
    Translator.from_checkpoint(ck, engine="ctranslate2")
    [made] = (tmp_path / "run" / "best.pt.engines").glob("ctranslate2-*")
    assert json.loads((made / "relmt_export.json").read_text())["step"] == 0
    reference = export(original, tmp_path / "reference")
    assert (made / "model.bin").read_bytes() == (reference / "model.bin").read_bytes()


# --- §4: relmt-export quantization= ---------------------------------------------------------------------

@pytest.mark.parametrize("fmt, weights", [("onnx", "int8"), ("aoti", "int16")])  # aoti writes int8 (issue 62)
def test_quantization_a_format_cannot_write_is_refused(fmt, weights, tmp_path, spm, capsys):
    ck = write_checkpoint(tmp_path / "run", "best.pt", spm, seed=5, model=model_config(relative_share_heads=True))
    out = tmp_path / "out"
    assert guarded("relmt-export", _export, [f"checkpoint={ck}", f"output={out}", f"format={fmt}",
                                             f"quantization={weights}"]) == 2
    err = capsys.readouterr().err
    assert f"quantization={weights}" in err and f"format={fmt}" in err and "format=ctranslate2" in err, err
    assert "float32" in err and "Traceback" not in err and not out.exists()
    assert guarded("relmt-export", _export, [f"checkpoint={ck}", f"output={out}", f"format={fmt}",
                                             "quantization=no-such-type"]) == 2
    err = capsys.readouterr().err
    assert "quantization=no-such-type: must be one of" in err and "int8" in err, err
    # float32 is what these formats write: accepted (the run then fails on the missing checkpoint, not on it)
    assert guarded("relmt-export", _export, [f"checkpoint={tmp_path / 'none.pt'}", f"output={out}", f"format={fmt}",
                                             "quantization=float32"]) == 2
    assert "none.pt: no such checkpoint" in capsys.readouterr().err


def test_ctranslate2_quantizations_are_checked_before_the_checkpoint_is_read(tmp_path, capsys):
    pytest.importorskip("ctranslate2")
    from ctranslate2.specs.model_spec import ACCEPTED_MODEL_TYPES

    assert set(engines.QUANTIZATIONS[Engine.ctranslate2]) <= set(ACCEPTED_MODEL_TYPES)
    assert guarded("relmt-export", _export, [f"checkpoint={tmp_path / 'none.pt'}", f"output={tmp_path / 'o'}",
                                             "quantization=no-such-type"]) == 2
    assert "quantization=no-such-type: must be one of" in capsys.readouterr().err


def test_aoti_compiles_for_the_cores_whatever_the_compiling_process_s_threads(tmp_path, monkeypatch):
    """Inductor splits loops for the compiling process's torch threads: a package compiled in a one-thread process
    (relmt-translate with one thread, a test worker) had no parallel loop, so that a second thread later sped up its
    GEMMs alone (issue 62). export_aoti compiles every graph for the machine's cores, with MIN_CHUNK, in any
    process; the thread count is in the artefact's key."""
    from relmt.export import aoti

    seen = []

    def compile_and_package(program, package_path, inductor_configs):
        seen.append(inductor_configs)
        Path(package_path).write_bytes(b"")

    monkeypatch.setattr(torch._inductor, "aoti_compile_and_package", compile_and_package)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        aoti.export_aoti(random_model(model_config(), 40, seed=0), tmp_path)
    finally:
        torch.set_num_threads(threads)
    cores = len(os.sched_getaffinity(0))
    assert aoti.compile_threads() == cores and len(seen) == 5  # encoder, step, search, search_small, loop
    assert all(c["cpp.threads"] == cores and c["cpp.min_chunk_size"] == aoti.MIN_CHUNK for c in seen)
    meta = json.loads((tmp_path / "aoti.json").read_text())
    assert meta["threads"] == cores and meta["graphs"] == aoti.graphs.GRAPHS_VERSION  # which AotiModel checks
    assert engines.dependencies(Engine.aoti)["aoti threads"] == str(cores)


def test_the_aoti_compile_says_what_it_does_and_silences_inductors_autotune_report(tmp_path, monkeypatch, caplog,
                                                                                    capsys):
    """The first engine=aoti use compiled for minutes with no progress line, and printed inductor's report of each
    autotuned GEMM, a JSON blob after "Autotune Choices Stats:" (issue 74 §4). Now a line before each graph names it
    and where the packages are kept, one after it gives its time, and the report is off. The compile is a stand-in
    that writes the report as torch does, under the configs relmt gives it; that torch writes it only under the
    config relmt turns off is read from torch's source."""
    import inspect
    import re

    from torch._inductor import config as inductor_config
    from torch._inductor import select_algorithm

    from relmt.export import aoti

    assert "Autotune Choices Stats" in inspect.getsource(select_algorithm._log_autotune_choices_stats)
    assert re.search(r"if config\.max_autotune_report_choices_stats:\s+_log_autotune_choices_stats\(",
                     inspect.getsource(select_algorithm))

    def compile_and_package(program, package_path, inductor_configs):
        with inductor_config.patch(inductor_configs):  # an unknown config is an AttributeError here, as in torch
            if inductor_config.max_autotune_report_choices_stats:
                sys.stderr.write('Autotune Choices Stats:\n{"num_choices": 2, "best_kernel": "cpp_template"}\n')
        Path(package_path).write_bytes(b"")

    monkeypatch.setattr(torch._inductor, "aoti_compile_and_package", compile_and_package)
    monkeypatch.setattr(aoti, "check_compiler", lambda: "g++")
    caplog.set_level(logging.WARNING, logger=aoti.__name__)
    kept = tmp_path / "best.pt.engines" / "aoti-0123"
    aoti.export_aoti(random_model(model_config(), 40, seed=0), tmp_path / "build", kept_in=kept)
    assert "Autotune Choices Stats" not in capsys.readouterr().err
    lines = [r.getMessage() for r in caplog.records if r.name == aoti.__name__]
    graphs = ("encoder", "step", "search", "search_small", "loop")
    for i, name in enumerate(graphs):
        assert f"engine=aoti: compiling the {name} graph ({i + 1} of 5; a few minutes in all" in lines[2 * i]
        assert str(kept) in lines[2 * i]
        assert re.fullmatch(rf"engine=aoti: compiled the {name} graph in \d+ s", lines[2 * i + 1])
    assert re.fullmatch(r"engine=aoti: compiled 5 graphs in [\d.]+ minutes", lines[10])


def test_an_engine_artefact_s_aoti_compile_names_the_artefact_not_its_build_folder(tmp_path, monkeypatch):
    """The log lines name where the packages stay: the artefact folder, not the hidden build folder they are
    compiled in (relmt-export: its output=)."""
    import relmt.export.aoti as aoti

    kept = []
    monkeypatch.setattr(aoti, "export_aoti", lambda model, directory, quantization="float32", kept_in=None:
                        kept.append((Path(directory), kept_in)) or directory)
    monkeypatch.setattr(aoti, "AotiModel", lambda directory: Path(directory))
    ck = tmp_path / "best.pt"
    ck.write_bytes(b"stand-in")
    target = engines.graph_model(Engine.aoti, None, ck, CHECKSUM_A)
    assert kept[0][1] == target and kept[0][0] != target and kept[0][0].name.startswith(f".{target.name}.")
    assert engines.BUILDING.get() is None
