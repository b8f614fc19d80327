"""Which engine runs a checkpoint's network at translation time (issue 33 §2), and where its artefact lives.

- torch: relmt's own modules (eager, or torch.compile'd with compile=true);
- onnx: the network exported to ONNX and run by onnxruntime (relmt/export/onnx.py);
- aoti: the network compiled ahead of time by AOTInductor (relmt/export/aoti.py; needs a C++ compiler);
  with onnx and aoti relmt's searches stay in charge (relmt/export/graphs.py), so every decoding option keeps
  working, and every model exports, per-head tables and every position mode included;
- ctranslate2: the model converted for CTranslate2 (relmt/export/ctranslate2.py), which also runs its own
  beam search; models with per-head relative tables, or ALiBi, are refused as relmt-export refuses them.

An engine's artefact is made on first use and kept next to the checkpoint, in `<checkpoint>.engines/`, under
a name that holds the checkpoint's checksum, so a checkpoint that changes gets a new one; where the
checkpoint's folder is read-only, under $XDG_CACHE_HOME/relmt (default ~/.cache/relmt) instead.
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
from enum import Enum
from pathlib import Path

import torch

log = logging.getLogger(__name__)


class Engine(str, Enum):
    torch = "torch"
    onnx = "onnx"
    aoti = "aoti"
    ctranslate2 = "ctranslate2"


def engine_of(value: Engine | str) -> Engine:
    from relmt.errors import UserError

    try:
        return Engine(value)
    except ValueError:
        raise UserError(f"engine={value}: must be one of {', '.join(e.value for e in Engine)}") from None


def artefact_dir(checkpoint: Path, engine: Engine, checksum: str) -> Path:
    """Where `engine`'s artefact of the checkpoint goes: beside it if that folder is writable, else in the
    user's cache."""
    name = f"{engine.value}-{checksum[:16]}"
    beside = checkpoint.parent / f"{checkpoint.name}.engines"
    if os.access(checkpoint.parent, os.W_OK) or (beside / name).is_dir():
        return beside / name
    cache = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "relmt" / checksum[:16]
    log.warning("%s is not writable: the %s engine's files go to %s", checkpoint.parent, engine.value, cache)
    return cache / name


def build_artefact(target: Path, write) -> Path:
    """`write(tmp_dir)` into a fresh folder, then moved to `target` in one rename (a killed export leaves no
    half-written artefact; two processes racing write the same thing)."""
    if target.is_dir():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    try:
        write(tmp)
        os.replace(tmp, target)
    except OSError:
        if not target.is_dir():
            raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


def write_graphs(engine: Engine, model, directory: Path) -> Path:
    """The graphs of onnx or aoti for `model`, written into `directory`."""
    if engine == Engine.onnx:
        from relmt.export.onnx import export_onnx

        return export_onnx(model, directory)
    from relmt.export.aoti import export_aoti

    return export_aoti(model, directory)


def graph_model(engine: Engine, model, checkpoint: Path, checksum: str, threads: int = 0):
    """The checkpoint's model on the onnx or aoti engine (a relmt.export.graphs.GraphModel), its artefact made
    on first use."""
    target = artefact_dir(checkpoint, engine, checksum)
    if not target.is_dir():
        log.warning("engine=%s: exporting %s once, to %s", engine.value, checkpoint, target)
    build_artefact(target, lambda tmp: write_graphs(engine, model, tmp))
    if engine == Engine.onnx:
        from relmt.export.onnx import OnnxModel

        return OnnxModel(target, threads)
    from relmt.export.aoti import AotiModel

    return AotiModel(target)


def export_checkpoint(checkpoint_path: str | Path, output_dir: str | Path, engine: Engine, force: bool = False
                      ) -> Path:
    """relmt-export format=onnx|aoti: the checkpoint's two graphs, its sentencepiece.model and relmt_export.json
    (the decode config), written beside `output_dir` and moved into place, so a failed export leaves nothing."""
    import json

    from relmt import checkpoint
    from relmt.config import from_dict, to_dict
    from relmt.data.tokenizer import PAD_ID, Tokenizer
    from relmt.errors import UserError
    from relmt.export.decoding import INFO_FILE
    from relmt.model.transformer import build_model

    out = Path(output_dir)
    if out.exists() and not force:
        raise UserError(f"output={out}: already exists (give force=true to replace it)")
    ck = checkpoint.load(checkpoint_path)
    cfg = from_dict(ck["config"])
    tokenizer = Tokenizer("sentencepiece.model", model=ck["spm"]["model"])
    model = build_model(cfg.model, tokenizer.vocab_size, PAD_ID)
    checkpoint.load_model_state(model, ck["model"], Path(checkpoint_path))

    def write(tmp: Path) -> None:
        write_graphs(engine, model, tmp)
        (tmp / "sentencepiece.model").write_bytes(tokenizer.model_bytes())
        (tmp / INFO_FILE).write_text(json.dumps({"checkpoint": str(checkpoint_path), "format": engine.value,
                                                 "decode": to_dict(cfg)["decode"]}, indent=2) + "\n")

    new = out.with_name(f".{out.name}.new")
    shutil.rmtree(new, ignore_errors=True)
    build_artefact(new, write)
    if out.is_dir():  # the old export goes only once the new one is complete (force=true)
        shutil.rmtree(out)
    os.replace(new, out)
    return out


class Ct2Model:
    """A checkpoint converted for CTranslate2 (relmt.export.ctranslate2), which runs its own beam search with
    relmt's decode settings mapped as relmt.export.decoding says (its length penalty is |y|^alpha)."""

    def __init__(self, checkpoint: Path, checksum: str, threads: int = 0) -> None:
        import ctranslate2

        from relmt.export.ctranslate2 import export

        target = artefact_dir(checkpoint, Engine.ctranslate2, checksum)
        if not target.is_dir():
            log.warning("engine=ctranslate2: converting %s once, to %s", checkpoint, target)
        build_artefact(target, lambda tmp: export(checkpoint, tmp, force=True))
        self.translator = ctranslate2.Translator(str(target), device="cpu", intra_threads=threads or
                                                 torch.get_num_threads())

    def hypotheses(self, ids: list[list[int]], tokenizer, cfg) -> list[list]:
        """The cfg.nbest (ids, score) hypotheses of each source (ids without EOS), [] for an empty one."""
        from relmt.decode.beam import Hypothesis
        from relmt.export.decoding import decode_options

        todo = [i for i, x in enumerate(ids) if x]
        out: list[list] = [[] for _ in ids]
        if not todo:
            return out
        sp = tokenizer.sp
        pieces = [[sp.id_to_piece(t) for t in ids[i]] for i in todo]
        options = decode_options(cfg, max(len(p) for p in pieces))
        results = self.translator.translate_batch(pieces, return_scores=True, max_batch_size=cfg.max_source_tokens,
                                                  batch_type="tokens", **options)
        for i, result in zip(todo, results):
            out[i] = [Hypothesis([sp.piece_to_id(p) for p in hyp], score)
                      for hyp, score in zip(result.hypotheses, result.scores)]
        return out
