"""A relmt checkpoint as an Argos Translate package (`relmt-export format=argos`), the file that
argostranslate and LibreTranslate install.

    from relmt.export.argos import export
    export("runs/.../checkpoints/best.pt", "en_de.argosmodel", quantization="int8")

An `.argosmodel` is a zip of one folder, translate-{from}_{to}-{version}/, holding:
- model/: the CTranslate2 export (relmt/export/ctranslate2.py), relmt_export.json among its files;
- sentencepiece.model: the checkpoint's own, which Argos encodes sources with and decodes outputs with;
- spacy/: a blank spaCy pipeline of the source language (its rule-based tokenizer; "xx" where spaCy has
  no such language). Argos splits a text into sentences before translating; its default splitter,
  MiniSBD, downloads a model on first use, while ARGOS_CHUNK_TYPE=SPACY loads this folder and adds
  spaCy's rule-based sentencizer to it: nothing to download;
- metadata.json (Argos's package fields: codes, names, versions, a description naming relmt and the
  run) and README.md.

Argos decodes every package alike: beam ARGOS_BEAM_SIZE (4), CTranslate2's length_penalty 0.2 (a score
divided by |y|^0.2: relmt's decode.lenpen=0.2 decode.length_norm=power), at least 1 and at most 256
tokens (CTranslate2's defaults: decode.min_len=1 decode.max_len_a=0 decode.max_len_b=256), unknown outputs
replaced by a source piece, and in CTranslate2's compute_type ARGOS_COMPUTE_TYPE (auto: int8_float32 on a CPU
with int8 kernels, even for a float32 model; float32 gives relmt-translate engine=ctranslate2's outputs, tested
in tests/test_argos.py). The checkpoint's decode config cannot travel with the package; the
export says where it differs.

What Argos cannot run is refused before anything is written: what CTranslate2 cannot hold
(per-head relative tables, ALiBi: relmt/export/ctranslate2.py), RoPE and T5 biases (CTranslate2 4.x
runs them, but only through spec fields that Argos-trained models never use and that LibreTranslate's
own CTranslate2 builds are not checked against: Argos's models are OpenNMT-py Transformers with
sinusoidal or Shaw relative positions), and multilingual models (an Argos package translates one
pair, and its sources carry no target tag).
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import zipfile
from pathlib import Path

from relmt import checkpoint
from relmt.config import Config, DecodeConfig, LengthNorm, PosKind, from_dict
from relmt.errors import UserError
from relmt.export.ctranslate2 import QUANTIZATIONS, SPM_FILE, RelmtConverter, check_exportable

SUFFIX = ".argosmodel"
SPACY_DIR = "spacy"
ARGOS_VERSION = "1.11"  # the argostranslate release the package layout is tested with (tests/test_argos.py)
# What argostranslate passes to translate_batch for every package (argostranslate/translate.py)
ARGOS_BEAM, ARGOS_LENPEN, ARGOS_MAX_TOKENS = 4, 0.2, 256

REFUSED = {
    PosKind.rope: "RoPE runs in CTranslate2 only through its rotary spec fields, which Argos's OpenNMT-py "
                  "models never use",
    PosKind.t5: "T5 relative biases run in CTranslate2 only through its relative_attention_bias spec field, "
                "which Argos's OpenNMT-py models never use",
    PosKind.alibi: "CTranslate2 has no ALiBi in its encoder",
}


def offline_env(home: str | Path, compute_type: str = "float32", threads: int = 1) -> dict[str, str]:
    """The environment in which argostranslate (or LibreTranslate) runs an exported package offline, with its
    folders under `home` (XDG_*), the package's spaCy splitter (ARGOS_CHUNK_TYPE=SPACY), CTranslate2 in
    `compute_type` (Argos's default, auto, is int8_float32 on a CPU with int8 kernels; float32 gives
    relmt-translate engine=ctranslate2's outputs) on `threads` threads. It also creates the spaCy cache marker that
    keeps argostranslate 1.11 from fetching spaCy's xx_sent_ud_sm when first imported (it tries whenever the chunk
    type is SPACY, even for a package that brings its own splitter)."""
    home = Path(home)
    (home / "cache" / "argos-translate" / "spacy" / "senter" / "model").mkdir(parents=True, exist_ok=True)
    return {**os.environ, "XDG_DATA_HOME": str(home / "data"), "XDG_CACHE_HOME": str(home / "cache"),
            "XDG_CONFIG_HOME": str(home / "config"), "ARGOS_CHUNK_TYPE": "SPACY", "ARGOS_DEVICE_TYPE": "cpu",
            "ARGOS_COMPUTE_TYPE": compute_type, "ARGOS_INTRA_THREADS": str(threads), "OMP_NUM_THREADS": str(threads)}


def check_argos(cfg: Config) -> tuple[str, str]:
    """The package's (source, target) language codes; a UserError naming what Argos cannot run."""
    if cfg.model.positions in REFUSED:
        raise UserError(f"model.positions={cfg.model.positions.value}: an Argos package cannot hold it "
                        f"({REFUSED[cfg.model.positions]}); export format=ctranslate2, onnx or aoti instead")
    check_exportable(cfg.model)  # per-head tables
    if cfg.data.lang_tags:
        raise UserError("data.lang_tags=true: a multilingual model with target-language tags cannot be an Argos "
                        "package (one language pair per package, sources without tags)")
    pairs = sorted(set(cfg.data.pairs()))
    if len(pairs) > 1:
        raise UserError(f"data.corpora: the model translates {len(pairs)} language pairs "
                        f"({', '.join('-'.join(p) for p in pairs)}); an Argos package holds one")
    return pairs[0]


def language_name(code: str) -> str:
    """spaCy's name of a language code (its Language class: de -> German), else the code itself."""
    import spacy.util

    try:
        return spacy.util.get_lang_class(code).__name__
    except Exception:  # spaCy raises ImportError for a code it does not know
        return code


def blank_pipeline(code: str):
    """spaCy's blank pipeline of `code`, or the multi-language one ("xx") where spaCy has none."""
    import spacy

    try:
        return spacy.blank(code)
    except Exception:
        return spacy.blank("xx")


def decode_differences(decode: DecodeConfig) -> list[str]:
    """How the checkpoint's decode config differs from what Argos decodes with."""
    notes = []
    if decode.beam != ARGOS_BEAM:
        notes.append(f"decode.beam={decode.beam} (Argos: ARGOS_BEAM_SIZE, 4 unless set)")
    if decode.lenpen != ARGOS_LENPEN or (decode.lenpen and decode.length_norm != LengthNorm.power):
        notes.append(f"decode.lenpen={decode.lenpen:g} decode.length_norm={decode.length_norm.value} "
                     f"(Argos: {ARGOS_LENPEN:g}, power)")
    if decode.sampling:
        notes.append("decode.sampling=true (Argos: beam search)")
    return notes


def package_name(source: str, target: str, version: str) -> str:
    """Argos's folder name of a package (argospm's naming): translate-en_de-1_0."""
    return f"translate-{source}_{target}-{version.replace('.', '_')}"


def metadata(source: str, target: str, version: str, info: dict) -> dict:
    """metadata.json: Argos's package fields, and what relmt exported."""
    step = info.get("step")
    run = f"{info['checkpoint']}" + (f", step {step}" if step is not None else "")
    return {"package_version": version, "argos_version": ARGOS_VERSION,
            "from_code": source, "from_name": language_name(source),
            "to_code": target, "to_name": language_name(target), "type": "translate",
            "description": f"relmt (Transformer with {info['model']['positions']} positions, Shaw et al. 2018) "
                           f"from {run}",
            "relmt": {"checkpoint": info["checkpoint"], "step": step, "positions": info["model"]["positions"]}}


def readme(meta: dict) -> str:
    return (f"# {meta['from_name']} → {meta['to_name']}\n\n{meta['description']}.\n\n"
            "Exported by relmt-export format=argos. Sentences are split by spaCy's rule-based sentencizer "
            "(spacy/): set ARGOS_CHUNK_TYPE=SPACY, where nothing is downloaded.\n")


def export(checkpoint_path: str | Path, output: str | Path, quantization: str | None = None,
           source_lang: str = "", target_lang: str = "", version: str = "1.0",
           force: bool = False) -> Path:
    """Write the `.argosmodel` of a checkpoint; returns its path. `source_lang`/`target_lang` override the
    data config's language codes. The zip is written beside `output` and moved into place."""
    try:
        import spacy  # noqa: F401
    except ImportError as e:
        raise UserError(f"format=argos needs spaCy for the package's sentence splitter ({e}): "
                        "pip install 'relmt[argos]'") from None
    if quantization is not None and quantization not in QUANTIZATIONS:
        raise UserError(f"quantization={quantization}: must be one of {', '.join(QUANTIZATIONS)}")
    out = Path(output)
    if out.suffix != SUFFIX:
        raise UserError(f"output={out}: an Argos package's name ends in {SUFFIX}")
    if out.exists() and not force:
        raise UserError(f"output={out}: already exists (give force=true to replace it)")
    if not version or any(c in version for c in "/\\ "):
        raise UserError(f"package_version={version!r}: a package version such as 1.0")
    ck = checkpoint.load(checkpoint_path)
    src, tgt = check_argos(from_dict(ck["config"]))
    src, tgt = source_lang or src, target_lang or tgt
    for key, code in (("source_lang", src), ("target_lang", tgt)):
        if not code or any(c in code for c in "/\\ _-"):
            raise UserError(f"{key}={code!r}: a language code such as en (letters only)")
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".relmt-argos-", dir=out.parent) as tmp:
        folder = Path(tmp) / package_name(src, tgt, version)
        converter = RelmtConverter.from_payload(ck, checkpoint_path)
        converter.convert(str(folder / "model"), quantization=quantization)
        shutil.copyfile(folder / "model" / SPM_FILE, folder / SPM_FILE)
        blank_pipeline(src).to_disk(folder / SPACY_DIR)
        meta = metadata(src, tgt, version, converter.info)
        (folder / "metadata.json").write_text(json.dumps(meta, indent=2, ensure_ascii=False) + "\n")
        (folder / "README.md").write_text(readme(meta))
        zipped = Path(tmp) / "package.zip"
        with zipfile.ZipFile(zipped, "w", zipfile.ZIP_DEFLATED) as z:
            for path in sorted(folder.rglob("*")):
                z.write(path, path.relative_to(tmp))
        os.replace(zipped, out)
    return out
