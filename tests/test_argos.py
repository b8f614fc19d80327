"""relmt-export format=argos: the package that argostranslate installs and runs, offline, and what it refuses.

A tiny model with head-shared relative tables, trained on toy data, is exported to an .argosmodel; the real
argostranslate (the dev extra) installs it with package.install_from_path and translates the toy test set in a
subprocess of its own (Argos reads its settings from the environment when first imported), its data and cache
in a temporary folder, ARGOS_CHUNK_TYPE=SPACY (the package's own sentence splitter: nothing to download) and
ARGOS_COMPUTE_TYPE=float32 (Argos's default, auto, runs a float32 model as int8_float32 where the CPU can).
Each output must equal relmt-translate engine=ctranslate2's at Argos's decoding settings (beam 4, length
penalty 0.2 as |y|^0.2, at least 1 and at most 256 tokens: CTranslate2's defaults).
"""

from __future__ import annotations

import importlib.util
import json
import os
import socket
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import pytest

# The dev extra has them (make test); a machine without them (the GPU image) skips the module. Looked up, not
# imported: argostranslate makes its folders under the home directory when imported.
for _name in ("ctranslate2", "spacy", "argostranslate"):
    if importlib.util.find_spec(_name) is None:
        pytest.skip(f"{_name} is not installed (the dev extra has it)", allow_module_level=True)

from relmt.cli.common import guarded  # noqa: E402
from relmt.cli.export import _export  # noqa: E402
from relmt.cli.translate import _translate  # noqa: E402
from relmt.config import DataConfig, PosKind, Source  # noqa: E402
from relmt.data.toy import generate  # noqa: E402
from relmt.errors import UserError  # noqa: E402
from relmt.export.argos import check_argos, export, metadata, offline_env  # noqa: E402
from tests.tiny_checkpoints import model_config, shared_tiny, toy_tokenizer, write_checkpoint  # noqa: E402

ARGOS = """
import json, sys
from pathlib import Path
import argostranslate.package, argostranslate.translate
argostranslate.package.install_from_path(Path(sys.argv[1]))
[pkg] = argostranslate.package.get_installed_packages()
lines = Path(sys.argv[2]).read_text().splitlines()
out = [argostranslate.translate.translate(line, pkg.from_code, pkg.to_code) for line in lines]
print(json.dumps({"installed": str(pkg.package_path), "from": pkg.from_code, "to": pkg.to_code, "out": out}))
"""


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> Path:
    return shared_tiny(tmp_path_factory, "tiny_shared_heads", "model.relative_share_heads=true")


def test_argostranslate_installs_the_package_and_translates_as_relmt_does(trained, tmp_path, capsys):
    package = tmp_path / "toy.argosmodel"
    assert guarded("relmt-export", _export, [f"checkpoint={trained}", f"output={package}", "format=argos"]) == 0
    captured = capsys.readouterr()
    assert f"to {package} (Argos Translate package" in captured.out
    assert "Argos decodes with beam 4 and length penalty 0.2" in captured.err  # train=debug decodes otherwise
    with zipfile.ZipFile(package) as z:
        names = z.namelist()
        meta = json.loads(z.read("translate-src_tgt-1_0/metadata.json"))
    assert {"translate-src_tgt-1_0/sentencepiece.model", "translate-src_tgt-1_0/model/model.bin",
            "translate-src_tgt-1_0/spacy/meta.json", "translate-src_tgt-1_0/README.md"} <= set(names)
    assert (meta["from_code"], meta["to_code"], meta["package_version"]) == ("src", "tgt", "1.0")
    assert "relmt" in meta["description"] and str(trained) in meta["description"]

    # the toy test set (data.toy seed 1, as trained), one sentence per line
    sources = [src for src, _ in generate(seed=1, n_train=0, n_valid=0, n_test=60, n_test_long=0, max_words=8)["test"]]
    lines = tmp_path / "test.src"
    lines.write_text("\n".join(sources) + "\n")
    done = subprocess.run([sys.executable, "-c", ARGOS, str(package), str(lines)], env=offline_env(tmp_path / "home"),
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    argos = json.loads(done.stdout.strip().splitlines()[-1])
    assert argos["installed"].startswith(str(tmp_path / "home" / "data"))
    assert (argos["from"], argos["to"]) == ("src", "tgt")

    ours = tmp_path / "test.ct2"
    assert guarded("relmt-translate", _translate, [
        f"checkpoint={trained}", f"input={lines}", f"output={ours}", "engine=ctranslate2", "beam=4", "lenpen=0.2",
        "length_norm=power", "max_len_a=0", "max_len_b=256", "min_len=1", "device=cpu", "threads=1"]) == 0
    expected = ours.read_text().splitlines()
    assert len(argos["out"]) == len(expected) == len(sources)
    diff = [(s, a, b) for s, a, b in zip(sources, argos["out"], expected) if a != b]
    assert not diff, (len(diff), diff[:5])
    assert len(set(expected)) > len(expected) // 2  # a model that translates, not one output for all


def test_metadata_names_languages_and_the_run():
    meta = metadata("de", "en", "2.1", {"checkpoint": "runs/x/best.pt", "step": 900, "model": {"positions": "rel"}})
    assert (meta["from_name"], meta["to_name"], meta["type"]) == ("German", "English", "translate")
    assert meta["description"] == ("relmt (Transformer with rel positions, Shaw et al. 2018) from runs/x/best.pt, "
                                   "step 900")
    assert metadata("src", "tgt", "1", {"checkpoint": "c", "model": {"positions": "abs"}})["from_name"] == "src"


@pytest.mark.parametrize("fields,message", [
    ({"positions": PosKind.rope}, "model.positions=rope: an Argos package cannot hold it"),
    ({"positions": PosKind.t5}, "model.positions=t5: an Argos package cannot hold it"),
    ({"positions": PosKind.alibi}, "model.positions=alibi: an Argos package cannot hold it (CTranslate2 has no ALiBi"),
    ({"positions": PosKind.rel, "relative_share_heads": False}, "one a^K/a^V table per attention head"),
])
def test_what_argos_cannot_run_is_refused_by_name(fields, message, tmp_path, capsys):
    spm = toy_tokenizer(tmp_path)
    ck = write_checkpoint(tmp_path, "model.pt", spm, seed=0, model=model_config(**fields))
    out = tmp_path / "x.argosmodel"
    assert guarded("relmt-export", _export, [f"checkpoint={ck}", f"output={out}", "format=argos"]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err
    assert not out.exists() and list(tmp_path.glob(".relmt-argos-*")) == []


def test_multilingual_models_and_bad_arguments_are_refused(tmp_path, capsys):
    from relmt.config import Config, CorpusConfig

    corpora = [CorpusConfig(name="a", source=Source.toy, src="en", tgt="de"),
               CorpusConfig(name="b", source=Source.toy, src="en", tgt="fr")]
    tagged = Config(model=model_config(relative_share_heads=True),
                    data=DataConfig(source=Source.corpora, lang_tags=True, corpora=corpora))
    with pytest.raises(UserError, match="data.lang_tags=true: a multilingual model"):
        check_argos(tagged)
    tagged.data.lang_tags = False
    with pytest.raises(UserError, match="translates 2 language pairs"):
        check_argos(tagged)
    assert check_argos(Config(model=model_config(relative_share_heads=True))) == ("src", "tgt")

    spm = toy_tokenizer(tmp_path)
    ck = write_checkpoint(tmp_path, "model.pt", spm, seed=0, model=model_config(positions=PosKind.abs))
    for args, message in [
        ([f"output={tmp_path / 'x.zip'}"], "an Argos package's name ends in .argosmodel"),
        ([f"output={tmp_path / 'x.argosmodel'}", "source_lang=en_US"], "source_lang='en_US': a language code"),
        ([f"output={tmp_path / 'x.argosmodel'}", "quantization=int3"], "quantization=int3: must be one of"),
        ([f"output={tmp_path / 'x.argosmodel'}", "package_version=1 0"], "package_version='1 0'"),
    ]:
        assert guarded("relmt-export", _export, [f"checkpoint={ck}", "format=argos", *args]) == 2
        assert message in capsys.readouterr().err
    out = export(ck, tmp_path / "en_de.argosmodel", source_lang="en", target_lang="de", quantization="int8")
    with zipfile.ZipFile(out) as z:
        meta = json.loads(z.read("translate-en_de-1_0/metadata.json"))
        spacy_meta = json.loads(z.read("translate-en_de-1_0/spacy/meta.json"))
    assert (meta["from_name"], meta["to_name"], spacy_meta["lang"]) == ("English", "German", "en")
    with pytest.raises(UserError, match="already exists"):
        export(ck, out)


# --- LibreTranslate itself, serving the package -------------------------------------------------------------

ROOT = Path(__file__).parent.parent
# make test builds it (Makefile: LT_VENV): LibreTranslate pins flask, numpy<2 and requests, so it has its own venv
LT_VENV = Path(os.environ.get("RELMT_LIBRETRANSLATE_VENV", ROOT / ".venv-libretranslate"))
INSTALL = ("import sys, pathlib, argostranslate.package as p\n"
           "for f in sys.argv[1:]: p.install_from_path(pathlib.Path(f))")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_libretranslate_serves_the_package_offline(trained, tmp_path):
    """LibreTranslate 1.9 starts offline once two packages are installed (with fewer it fetches its package
    index first, and retries while offline), so the model goes in as en->de and, to make two, as de->en; its
    /translate answers as relmt-translate engine=ctranslate2 does, asked through libretranslatepy."""
    from libretranslatepy import LibreTranslateAPI

    assert (LT_VENV / "bin" / "libretranslate").is_file(), f"{LT_VENV}: no LibreTranslate; make test builds it"
    packages = [export(trained, tmp_path / f"{a}_{b}.argosmodel", source_lang=a, target_lang=b)
                for a, b in (("en", "de"), ("de", "en"))]
    env = offline_env(tmp_path / "home")
    subprocess.run([LT_VENV / "bin" / "python", "-c", INSTALL, *map(str, packages)], env=env, check=True, timeout=120)
    sources = [src for src, _ in generate(seed=1, n_train=0, n_valid=0, n_test=12, n_test_long=0, max_words=8)["test"]]
    lines = tmp_path / "test.en"
    lines.write_text("\n".join(sources) + "\n")
    ours = tmp_path / "test.de"
    assert guarded("relmt-translate", _translate, [
        f"checkpoint={trained}", f"input={lines}", f"output={ours}", "engine=ctranslate2", "beam=4", "lenpen=0.2",
        "length_norm=power", "max_len_a=0", "max_len_b=256", "min_len=1", "device=cpu", "threads=1"]) == 0

    port, log = free_port(), tmp_path / "libretranslate.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen([LT_VENV / "bin" / "libretranslate", "--host", "127.0.0.1", "--port", str(port),
                                 "--load-only", "en,de", "--disable-files-translation"], stdout=out,
                                stderr=subprocess.STDOUT, env=env)
    url = f"http://127.0.0.1:{port}/"
    try:
        api = LibreTranslateAPI(url)
        deadline = time.monotonic() + 90
        while True:
            assert proc.poll() is None, f"LibreTranslate exited {proc.returncode}:\n{log.read_text()[-3000:]}"
            try:
                languages = api.languages()
                break
            except OSError:
                assert time.monotonic() < deadline, f"LibreTranslate not up in 90 s:\n{log.read_text()[-3000:]}"
                time.sleep(0.2)
        assert {lang["code"] for lang in languages} == {"en", "de"}
        theirs = [api.translate(line, "en", "de") for line in sources]
        assert theirs == ours.read_text().splitlines()
        assert "Name or service not known" not in log.read_text()  # nothing was fetched
    finally:
        proc.terminate()
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


@pytest.mark.slow
def test_deploy_routes_script_times_every_route_and_checks_their_texts(trained, tmp_path):
    """scripts/bench/deploy_routes.py at a few sentences: every route has a row, the float32 CTranslate2 routes
    agree, and the page's generated block gets the table."""
    page = tmp_path / "deploying.md"
    page.write_text("# x\n\n<!-- begin: generated by scripts/bench/deploy_routes.py -->\nold\n"
                    "<!-- end: generated by scripts/bench/deploy_routes.py -->\n")
    done = subprocess.run([sys.executable, ROOT / "scripts/bench/deploy_routes.py", "--checkpoint", str(trained),
                           "--one", "3", "--many", "5", "--batch", "2", "--engines", "torch,ctranslate2",
                           "--out", str(tmp_path / "r.json"),
                           "--md", str(tmp_path / "r.md"), "--page", str(page)],
                          capture_output=True, text=True, timeout=600, cwd=ROOT,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads((tmp_path / "r.json").read_text())
    assert result["float32_ct2_routes_agree"] is True
    routes = {(r["route"], r["per_request"]) for r in result["rows"]}
    assert len(routes) == len(result["rows"]) == 14
    assert all(r["sentences_per_s"] > 0 and r["sentences"] == (3 if r["per_request"] == 1 else 5)
               for r in result["rows"])
    assert "old" not in page.read_text() and "argostranslate 1.11, ARGOS_COMPUTE_TYPE=auto" in page.read_text()
