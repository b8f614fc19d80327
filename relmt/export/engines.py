"""Which engine runs a checkpoint's network at translation time (issue 33 §2), and where its artefact lives.

- torch: relmt's own modules (eager, or torch.compile'd with compile=true);
- onnx: the network exported to ONNX and run by onnxruntime (relmt/export/onnx.py); relmt's searches
  stay in charge, so every decoding option keeps working, and every model exports, per-head tables included;
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


def onnx_model(model, checkpoint: Path, checksum: str, threads: int = 0):
    """The checkpoint's model in onnxruntime, exported on first use (relmt.export.onnx)."""
    from relmt.export.onnx import OnnxModel, export_onnx

    target = artefact_dir(checkpoint, Engine.onnx, checksum)
    if not target.is_dir():
        log.warning("engine=onnx: exporting %s once, to %s", checkpoint, target)
    return OnnxModel(build_artefact(target, lambda tmp: export_onnx(model, tmp)), threads)


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
