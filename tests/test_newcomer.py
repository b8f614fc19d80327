"""What a new user trips over (issue 42 §5): empty evaluation splits, messages in OmegaConf's words,
a sweep job's resume hint, relmt installed outside a checkout, untrained models decoding to the
length limit, and torchvision notices from the ONNX exporter."""

from __future__ import annotations

import importlib.util
import logging
import shutil
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import yaml

from relmt.cli.average import _average
from relmt.cli.common import guarded
from relmt.cli.export import _export
from relmt.cli.score import _score
from relmt.cli.translate import _translate
from relmt.config import Config, DataConfig, DecodeConfig, SpmModel, ToyConfig, compose
from relmt.data.dataset import prepare
from relmt.errors import UserError

EN = ["the cat sits", "a dog runs fast", "the bird sings", "two cats sleep", "one dog barks", "the sun is warm",
      "a tree grows", "the river flows"]
DE = ["die katze sitzt", "ein hund rennt schnell", "der vogel singt", "zwei katzen schlafen", "ein hund bellt",
      "die sonne ist warm", "ein baum wächst", "der fluss fließt"]
REPO = Path(__file__).resolve().parent.parent


def write_split(folder: Path, split: str, en: list[str], de: list[str]) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{split}.en").write_text("".join(s + "\n" for s in en), encoding="utf-8")
    (folder / f"{split}.de").write_text("".join(s + "\n" for s in de), encoding="utf-8")


def text_corpus(tmp_path: Path, valid: int = 3, test: int = 3) -> Path:
    folder = tmp_path / "corpus"
    write_split(folder, "train", EN * 3, DE * 3)
    write_split(folder, "valid", EN[:valid], DE[:valid])
    write_split(folder, "test", EN[3:3 + test], DE[3:3 + test])
    return folder


def text_data(tmp_path: Path, **changes) -> DataConfig:
    return DataConfig(**{**dict(name="fixture", source="text", dir=str(tmp_path / "corpus"), src="en", tgt="de",
                                splits={"train": "train", "valid": "valid", "test": "test"}, vocab_size=60,
                                spm_model_type=SpmModel.word, cache_dir=str(tmp_path / "cache")), **changes})


# --- 1. empty evaluation splits ----------------------------------------------------------------------

@pytest.mark.parametrize("split", ["valid", "test"])
def test_an_empty_evaluation_split_is_refused_naming_its_files(tmp_path, split):
    """It used to end in KeyError: 'Field "drop" does not exist in schema' (datasets.map on no rows)."""
    text_corpus(tmp_path, **{split: 0})
    folder = tmp_path / "corpus"
    with pytest.raises(UserError, match=rf"{folder / f'{split}.en'} and {folder / f'{split}.de'} "
                                        rf"\(data\.splits\.{split}={split}\): .*is empty") as e:
        prepare(text_data(tmp_path))
    way_out = "put sentence pairs" if split == "valid" else f"~data.splits.{split}"
    assert way_out in str(e.value)
    assert [p.name for p in (tmp_path / "cache").iterdir() if p.is_dir()] == []  # nothing half-built


def test_an_empty_split_from_relmt_prepare_is_one_message(tmp_path, capsys):
    from relmt.cli.prepare import _prepare

    text_corpus(tmp_path, test=0)
    argv = ["data=text", f"data.dir={tmp_path / 'corpus'}", f"data.cache_dir={tmp_path / 'cache'}",
            "data.vocab_size=60", "data.spm_model_type=word"]
    assert guarded("relmt-prepare", _prepare, argv) == 2
    err = capsys.readouterr().err
    assert "test.en and" in err and "is empty" in err and "KeyError" not in err and "Traceback" not in err


def test_an_empty_toy_test_split_is_left_out_and_an_empty_valid_split_refused(tmp_path):
    toy = dict(n_train=200, n_valid=10, n_test=10, n_test_long=0)
    corpus = prepare(DataConfig(toy=ToyConfig(**toy), vocab_size=100, cache_dir=str(tmp_path)))
    assert sorted(corpus.splits) == ["test", "train", "valid"]
    with pytest.raises(UserError, match=r"the toy split 'valid' \(data\.toy\).*data\.toy\.n_valid"):
        prepare(DataConfig(toy=ToyConfig(**{**toy, "n_valid": 0}), vocab_size=100, cache_dir=str(tmp_path)))


# --- 2. required arguments in plain words --------------------------------------------------------------

@pytest.mark.parametrize("name,command,argv,missing", [
    ("relmt-translate", _translate, [], "checkpoint= is required"),
    ("relmt-translate", _translate, ["input=x.en"], "checkpoint= is required"),
    ("relmt-score", _score, [], "hyp= and ref= are required"),
    ("relmt-score", _score, ["hyp=a.de"], "ref= is required"),
    ("relmt-export", _export, ["checkpoint=a.pt"], "output= is required"),
    ("relmt-average", _average, ["dir=runs/x/checkpoints"], "output= is required"),
    ("relmt-translate", _translate, ["checkpoint=???"], "checkpoint= is required"),
])
def test_a_missing_required_argument_is_named_with_an_example(name, command, argv, missing, capsys):
    assert guarded(name, command, argv) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"{name}: error: {missing}, e.g. {name} "), err
    assert "mandatory" not in err and "full_key" not in err and "Structured config" not in err
    assert len(err.splitlines()) == 1


def test_a_missing_checkpoint_is_reported_before_the_input(tmp_path, capsys):
    argv = [f"checkpoint={tmp_path / 'nope' / 'best.pt'}", f"input={tmp_path / 'x.en'}"]
    assert guarded("relmt-translate", _translate, argv) == 2
    err = capsys.readouterr().err
    assert "nope/best.pt: no such checkpoint" in err and "input=" not in err


def test_data_dir_required_says_what_to_pass():
    with pytest.raises(ValueError, match=r"data\.dir: is required for source=text: .*\{split\}\.\{en,de\} .*"
                                         r"e\.g\. data\.dir="):
        compose(["data=text"])


def test_a_config_key_left_at_missing_is_named_in_plain_words(tmp_path, capsys):
    """relmt-prepare printed OmegaConf's 'Structured config of type `DataConfig` has missing mandatory
    value', and relmt-train a traceback."""
    from omegaconf import OmegaConf

    from relmt.cli.prepare import _prepare
    from relmt.cli.train import _train_job

    with pytest.raises(ValueError, match=r"^data\.src: is required .*, e\.g\. data\.src=VALUE$"):
        compose(["data.src=???"])
    assert guarded("relmt-prepare", _prepare, ["data.src=???"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("relmt-prepare: error: data.src: is required") and len(err.splitlines()) == 1, err
    dcfg = OmegaConf.structured(compose([f"data.cache_dir={tmp_path / 'cache'}"]))
    dcfg.data.src, dcfg.out_dir = "???", str(tmp_path / "run")
    with pytest.raises(SystemExit) as e:
        _train_job(dcfg)
    assert e.value.code == 2
    assert capsys.readouterr().err.startswith("relmt-train: error: data.src: is required")


# --- 3. a sweep job's resume hint ---------------------------------------------------------------------

def hydra_state(mode: str, task: list[str], hydra: list[str], sweep_dir: str = "", run_dir: str = ""):
    from hydra.types import RunMode

    return SimpleNamespace(mode=RunMode[mode], overrides=SimpleNamespace(task=task, hydra=hydra),
                           sweep=SimpleNamespace(dir=sweep_dir), runtime=SimpleNamespace(output_dir=run_dir))


def test_a_sweep_job_is_resumed_by_requeueing_its_sweep(tmp_path):
    """The README's form (Exit status): the sweep's own overrides, -m, train.resume=true and
    hydra.sweep.dir; multirun.yaml in the sweep directory holds the overrides as given (a,b), while
    the job knows only its own point."""
    from relmt.cli.rundirs import resume_hint, sweep_overrides

    sweep = tmp_path / "multirun" / "s"
    sweep.mkdir(parents=True)
    (sweep / "multirun.yaml").write_text(yaml.safe_dump({"hydra": {"overrides": {
        "task": ["experiment=toy_rel", "model.positions=abs,rel", "train.resume=false"],
        "hydra": [f"hydra.sweep.dir={sweep}", "hydra.mode=MULTIRUN", "hydra/launcher=parallel"]}}}))
    job = hydra_state("MULTIRUN", ["experiment=toy_rel", "model.positions=abs"],
                      [f"hydra.sweep.dir={sweep}", "hydra.mode=MULTIRUN", "hydra/launcher=parallel"], str(sweep))
    assert resume_hint(job, str(sweep / "model.positions=abs")) == (
        f"relmt-train -m experiment=toy_rel model.positions=abs,rel hydra/launcher=parallel train.resume=true "
        f"hydra.sweep.dir={sweep}")
    # without multirun.yaml (deleted, or another launcher): the job's own point, as a sweep of one
    (sweep / "multirun.yaml").unlink()
    assert sweep_overrides(job) == ["experiment=toy_rel", "model.positions=abs", "hydra/launcher=parallel"]


def test_a_single_run_keeps_the_single_run_form():
    from relmt.cli.rundirs import resume_hint

    run = hydra_state("RUN", ["model=tiny", "train.resume=true"], ["hydra.run.dir=runs/a b"], run_dir="/x/runs/a b")
    assert resume_hint(run, "runs/a b") == "relmt-train model=tiny train.resume=true \"hydra.run.dir='runs/a b'\""
    assert resume_hint(None, "runs/x") == "relmt-train train.resume=true hydra.run.dir=runs/x"


def test_sweep_resume_command_quotes_for_the_shell():
    from relmt.cli.rundirs import sweep_resume_command

    assert sweep_resume_command(["data.dir='a b'", "seed=1,2"], "multirun/x y") == (
        "relmt-train -m \"data.dir='a b'\" seed=1,2 train.resume=true \"hydra.sweep.dir='multirun/x y'\"")


# --- 4. installed outside a checkout ------------------------------------------------------------------

def test_the_cache_stays_in_data_cache_in_a_checkout():
    assert DataConfig().cache_dir == "data/cache"
    assert compose([]).data.cache_dir == "data/cache"


def test_installed_the_cache_goes_to_the_user_cache_directory(tmp_path, monkeypatch):
    import relmt.config

    monkeypatch.setattr(relmt.config, "source_checkout", lambda: None)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert DataConfig().cache_dir == str(tmp_path / "xdg" / "relmt")
    assert compose([]).data.cache_dir == str(tmp_path / "xdg" / "relmt")
    monkeypatch.setenv("XDG_CACHE_HOME", "relative/ignored")  # the XDG spec: only absolute paths count
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert DataConfig().cache_dir == str(tmp_path / "home" / ".cache" / "relmt")


def test_an_installed_package_caches_in_the_user_cache_and_advises_without_the_repo(tmp_path):
    """relmt as a wheel lays it out (the package with configs/ inside, no pyproject.toml beside it),
    run from another directory: the cache goes to $XDG_CACHE_HOME/relmt, the log says so, and the
    Multi30k advice names the download instead of data/get_multi30k.sh, which the wheel lacks."""
    site, work = tmp_path / "site", tmp_path / "work"
    shutil.copytree(REPO / "relmt", site / "relmt", ignore=shutil.ignore_patterns("__pycache__", "configs"))
    shutil.copytree(REPO / "configs", site / "relmt" / "configs")
    work.mkdir()
    script = (
        "import sys\n"
        "from relmt.cli.common import guarded\nfrom relmt.cli.prepare import _prepare\n"
        "toy = ['data.toy.n_train=100', 'data.toy.n_valid=5', 'data.toy.n_test=5', 'data.toy.n_test_long=5',\n"
        "       'data.vocab_size=100']\n"
        "print('rc', guarded('relmt-prepare', _prepare, toy))\n"
        "print('rc', guarded('relmt-prepare', _prepare, ['experiment=multi30k_cpu', 'data.dir=/no/multi30k']))\n")
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(site), "XDG_CACHE_HOME": str(tmp_path / "xdg"),
           "HOME": str(tmp_path), "HF_DATASETS_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "-c", script], cwd=work, env=env, capture_output=True, text=True,
                          timeout=120)
    assert done.stdout.count("rc ") == 2, done.stderr
    assert done.stdout.splitlines()[-1] == "rc 2" and "rc 0" in done.stdout, done.stdout + done.stderr
    assert [p.name.split("-")[0] for p in (tmp_path / "xdg" / "relmt").iterdir() if p.is_dir()] == ["toy"]
    assert not (work / "data").exists()
    assert f"data cache: {tmp_path / 'xdg' / 'relmt'}" in done.stderr
    advice = done.stderr.splitlines()[-1]
    assert "get_multi30k.sh" not in advice and "github.com/multi30k/dataset" in advice, advice


# --- 5. decoding bounded by the source length -----------------------------------------------------------

def test_the_presets_bound_decoding_by_the_source_length():
    """|x| + 50 (tensor2tensor) let an untrained model spend 50 steps on every sentence; the presets and
    the schema now agree on a bound proportional to the source."""
    schema = DecodeConfig()
    assert schema.max_len_b <= 10 and schema.max_len_a >= 1.5
    for preset in ("greedy", "beam4"):
        cfg = compose([f"decode={preset}"]).decode
        assert (cfg.max_len_a, cfg.max_len_b) == (schema.max_len_a, schema.max_len_b), preset


@pytest.fixture(scope="module")
def untrained(tmp_path_factory):
    """A prepared tiny text corpus and an untrained model."""
    from tests.tiny_checkpoints import model_config, random_model

    tmp = tmp_path_factory.mktemp("untrained")
    text_corpus(tmp)
    corpus = prepare(text_data(tmp))
    return tmp, corpus, random_model(model_config(), corpus.tokenizer.vocab_size, seed=3)


def limits(corpus, split: str, cfg: DecodeConfig) -> list[int]:
    """floor(a * |x| + b), |x| the source's pieces and its EOS, per sentence of the split."""
    import math

    return [math.floor(cfg.max_len_a * int(n) + cfg.max_len_b) for n in corpus.ids(split).src_lens]


@pytest.mark.parametrize("preset", ["greedy", "beam4"])
def test_validation_test_and_translate_share_the_bound(untrained, preset, monkeypatch):
    """An untrained model that never ends a hypothesis (EOS banned by min_len) decodes every sentence
    to the bound, in the validation, the test scoring and relmt-translate alike."""
    import dataclasses

    import relmt.decode.translator
    import relmt.train.validate
    from relmt.decode.search import decode_sources
    from relmt.decode.translator import Translator
    from relmt.train.finish import score_tests
    from relmt.train.validate import translate_split

    tmp, corpus, model = untrained
    decode = dataclasses.replace(compose([f"decode={preset}"]).decode, min_len=10_000)
    cfg = Config(data=text_data(tmp), decode=decode)
    lengths: list[list[int]] = []

    def recorded(*args, **kw):
        hyps = decode_sources(*args, **kw)
        lengths.append([len(h[0].tokens) for h in hyps])
        return hyps

    for module in (relmt.train.validate, relmt.decode.translator):
        monkeypatch.setattr(module, "decode_sources", recorded)
    device = torch.device("cpu")
    translate_split(model, corpus, "valid", decode, device)
    metrics = score_tests(model, corpus, cfg, tmp / "none", tmp / f"run_{preset}", device, None)
    Translator(model, corpus.tokenizer, decode, device).translate(corpus.texts("test", "src"))
    assert metrics["test"]["test"]["sentences"] == 3
    # each stopped at floor(a * |x| + b) tokens, unfinished
    expected_test = limits(corpus, "test", decode)
    assert lengths == [limits(corpus, "valid", decode), expected_test, expected_test]
    assert max(limits(corpus, "test", decode)) < 50  # tensor2tensor's |x| + 50 would be longer


# --- 6. no torchvision notices from the ONNX exporter ---------------------------------------------------

@pytest.mark.skipif(importlib.util.find_spec("torchvision") is not None, reason="torchvision is installed")
@pytest.mark.skipif(importlib.util.find_spec("onnxscript") is None, reason="needs relmt[onnx]")
def test_the_onnx_exporter_says_nothing_about_torchvision(capfd, caplog):
    """torch.onnx's op registry logs 'torchvision is not installed. Skipping torchvision::nms' (and
    roi_align, roi_pool, deform_conv2d) each time it is built, twice per export: relmt exports no
    vision ops."""
    from torch.onnx._internal.exporter import _registration

    import relmt.export.onnx  # noqa: F401  (installs the filter)

    with caplog.at_level(logging.INFO):
        assert _registration._get_overload("torchvision::nms") is None  # the call that logs it
        logging.getLogger(_registration.__name__).warning("another warning")  # others still pass
    assert "torchvision" not in capfd.readouterr().err + caplog.text
    assert "another warning" in caplog.text
