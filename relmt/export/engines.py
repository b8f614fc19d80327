"""Which engine runs a checkpoint's network at translation time (issue 33 §2), and where its artefact lives.

- torch: relmt's own modules (eager, or torch.compile'd with compile=true);
- onnx: the network exported to ONNX and run by onnxruntime (relmt/export/onnx.py);
- aoti: the network compiled ahead of time by AOTInductor (relmt/export/aoti.py; needs a C++ compiler);
  with onnx and aoti relmt's searches stay in charge (relmt/export/graphs.py), so every decoding option keeps
  working, and every model exports, per-head tables and every position mode included;
- ctranslate2: the model converted for CTranslate2 (relmt/export/ctranslate2.py), which also runs its own
  beam search; models with per-head relative tables, or ALiBi, are refused as relmt-export refuses them.

An engine's artefact is made on first use and kept next to the checkpoint, as `<checkpoint>.engines/<engine>-<key>`
(issue 42 §3). The key hashes everything the artefact depends on (`dependencies`): the checkpoint's checksum,
torch, the engine's library (onnx, onnxscript and onnxruntime, or ctranslate2) and relmt's own version of what it
exports (graphs.GRAPHS_VERSION, ctranslate2.CONVERTER_VERSION). A change in any of them builds a new artefact, and
one log line says which changed (the artefact's relmt_artefact.json records what its key was made of). Only the
newest artefact per engine stays: an older one goes at the next build or use once it has been unused for
KEEP_UNUSED_S (a process may be loading it; once loaded, no engine reads its files again). Where
`<checkpoint>.engines/` cannot be written, the artefacts go to $XDG_CACHE_HOME/relmt/engines/ (default
~/.cache/relmt/engines/), one folder per checkpoint path. Artefacts get the permissions the umask gives new
files and folders, so that other users of a shared checkpoint can read them.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import tempfile
import time
from contextvars import ContextVar
from enum import Enum
from pathlib import Path

import torch

log = logging.getLogger(__name__)

RECORD = "relmt_artefact.json"  # in each artefact: the checkpoint and the versions its key was made of
# the artefact folder ensure_artefact is building, while its `write` runs in a build folder beside it: what the
# aoti compile's log lines name as where the packages are kept
BUILDING: ContextVar[Path | None] = ContextVar("BUILDING", default=None)
KEEP_UNUSED_S = 300  # an older artefact goes once unused this long (5 minutes: far longer than any load takes)
DEAD_BUILD_S = 86400  # a hidden build folder this old was left by a killed process


class Engine(str, Enum):
    torch = "torch"
    onnx = "onnx"
    aoti = "aoti"
    ctranslate2 = "ctranslate2"


# The weight types relmt-export writes, by format (quantization=): CTranslate2 quantizes (this is its
# ACCEPTED_MODEL_TYPES; relmt.export.ctranslate2 checks a value against the installed version's), while the onnx
# and aoti graphs hold the float32 weights their engines run.
QUANTIZATIONS = {
    Engine.ctranslate2: ("int8", "int8_float32", "int8_float16", "int8_bfloat16", "int16", "float16", "bfloat16",
                         "float32"),
    Engine.onnx: ("float32",),
    Engine.aoti: ("float32", "int8"),  # int8: torchao's dynamic int8 linear maps (relmt/export/quantize.py)
}


def check_quantization(engine: Engine, value: str) -> None:
    """relmt-export quantization=`value` for format `engine`: nothing (float32) or a type the format writes, else a
    UserError naming the formats that can write it. format=ctranslate2 is checked by its exporter, against the
    installed CTranslate2."""
    from relmt.errors import UserError

    if not value or value in QUANTIZATIONS[engine] or engine == Engine.ctranslate2:
        return
    able = [e.value for e, types in QUANTIZATIONS.items() if value in types]
    writes = " or ".join(QUANTIZATIONS[engine])
    if not able:
        raise UserError(f"quantization={value}: must be one of {', '.join(QUANTIZATIONS[Engine.ctranslate2])} "
                        f"(format=ctranslate2; format={engine.value} writes {writes} only)")
    raise UserError(f"quantization={value}: format={engine.value} writes {writes} weights only (leave quantization "
                    f"out, or give float32); quantization={value} is for format={' or format='.join(able)}")


def engine_of(value: Engine | str) -> Engine:
    from relmt.errors import UserError

    try:
        return Engine(value)
    except ValueError:
        raise UserError(f"engine={value}: must be one of {', '.join(e.value for e in Engine)}") from None


# --- where an artefact lives, and its key -----------------------------------------------------------------

def library_version(name: str) -> str:
    """The installed version of the package `name` ("absent" if it is not installed)."""
    from importlib import import_module, metadata

    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:  # e.g. onnxruntime installed as onnxruntime-gpu
        try:
            return str(import_module(name).__version__)
        except (ImportError, AttributeError):
            return "absent"


def dependencies(engine: Engine, quantization: str = "float32") -> dict[str, str]:
    """What `engine`'s artefact depends on beside the checkpoint's bytes; a change in any makes a new one. A
    quantized artefact's key also holds its weight type and the quantizer's version (a float32 one's is as it
    was before quantization existed)."""
    deps = {"torch": torch.__version__}
    if quantization != "float32":
        from relmt.export.quantize import INT8_VERSION, torchao_version

        deps |= {"quantization": quantization, "torchao": torchao_version(), "relmt int8": str(INT8_VERSION)}
    if engine in (Engine.onnx, Engine.aoti):
        from relmt.export import graphs

        deps["relmt graphs"] = str(graphs.GRAPHS_VERSION)
    if engine == Engine.aoti:
        from relmt.export import aoti

        deps |= {"relmt aoti": str(aoti.AOTI_VERSION), "aoti threads": str(aoti.compile_threads())}
    if engine == Engine.onnx:
        from relmt.export import onnx

        deps |= {"opset": str(onnx.OPSET)} | {name: library_version(name) for name in ("onnx", "onnxscript",
                                                                                          "onnxruntime")}
    elif engine == Engine.ctranslate2:
        from relmt.export import ctranslate2

        deps |= {"ctranslate2": library_version("ctranslate2"), "relmt converter": str(ctranslate2.CONVERTER_VERSION)}
    return deps


def artefact_key(checksum: str, deps: dict[str, str]) -> str:
    """16 hex digits naming the artefact of the checkpoint with this checksum, made with `deps`."""
    return hashlib.sha256(json.dumps({"checkpoint": checksum, **deps}, sort_keys=True).encode()).hexdigest()[:16]


def cache_folder(checkpoint: Path) -> Path:
    """The cache's stand-in for `<checkpoint>.engines/`, where that cannot be written: one folder per checkpoint
    path under $XDG_CACHE_HOME/relmt/engines (default ~/.cache/relmt/engines)."""
    root = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "relmt" / "engines"
    where = hashlib.sha256(str(checkpoint.resolve()).encode()).hexdigest()[:16]
    return root / f"{checkpoint.name}-{where}"


def kind(engine: Engine, quantization: str = "float32") -> str:
    """The name an artefact folder starts with: the engine, and a quantized one's weight type (aoti_int8), so that
    the float32 and the int8 artefacts of a checkpoint are kept (and pruned) each on its own."""
    return engine.value if quantization == "float32" else f"{engine.value}_{quantization}"


def artefact_dir(checkpoint: Path, engine: Engine, checksum: str, deps: dict[str, str] | None = None,
                 quantization: str = "float32") -> Path:
    """Where `engine`'s artefact of the checkpoint is: in `<checkpoint>.engines/` if it is there already or that
    folder can be written (or made), else in the user's cache."""
    deps = deps if deps is not None else dependencies(engine, quantization)
    name = f"{kind(engine, quantization)}-{artefact_key(checksum, deps)}"
    beside = checkpoint.parent / f"{checkpoint.name}.engines"
    if (beside / name).is_dir() or os.access(beside if beside.is_dir() else checkpoint.parent, os.W_OK):
        return beside / name
    return cache_folder(checkpoint) / name


# --- making an artefact -----------------------------------------------------------------------------------

def umask() -> int:
    """The process's umask: read from /proc where Linux offers it (setting it to read it would change it, for a
    moment, for every thread), else set and put back."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def open_up(root: Path) -> None:
    """Give `root` (mkdtemp makes it 0700) and everything under it the permissions the umask gives a new folder
    (0777 & ~umask) or file (0666 & ~umask; 0777 & ~umask if executable), so other users can read them."""
    mask = umask()
    for folder, _, files in os.walk(root):
        os.chmod(folder, 0o777 & ~mask)
        for name in files:
            path = os.path.join(folder, name)
            if not os.path.islink(path):
                executable = os.stat(path).st_mode & 0o111
                os.chmod(path, (0o777 if executable else 0o666) & ~mask)


def build_folder(target: Path) -> Path:
    """A fresh hidden folder beside `target` to build it in (PermissionError where that cannot be written)."""
    target.parent.mkdir(parents=True, exist_ok=True)
    return Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))


def build_artefact(target: Path, write, tmp: Path | None = None) -> Path:
    """`write(tmp_dir)` into a fresh folder (`tmp`, or one made by build_folder), then moved to `target` in one
    rename (a killed export leaves no half-written artefact; two processes racing write the same thing), with
    the umask's permissions."""
    if target.is_dir():
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
        return target
    tmp = tmp if tmp is not None else build_folder(target)
    try:
        write(tmp)
        open_up(tmp)
        os.replace(tmp, target)
    except OSError:
        if not target.is_dir():
            raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


def last_use(path: Path) -> float:
    """When the artefact at `path` was last made or used (ensure_artefact touches it), 0 if it has gone."""
    try:
        return path.stat().st_mtime
    except OSError:
        return 0.0


def why_new(target: Path, checksum: str, deps: dict[str, str]) -> str:
    """Why `target` is built: first for this checkpoint, or what changed since the engine's newest artefact beside
    it (from its record)."""
    engine = target.name.split("-")[0]
    older = [p for p in target.parent.glob(f"{engine}-*") if p.is_dir() and p != target]
    if not older:
        return "once"
    newest = max(older, key=last_use)
    try:
        made = json.loads((newest / RECORD).read_text())
    except (OSError, ValueError):
        return f"again ({newest.name} was made by an older relmt)"
    changed = ["the checkpoint changed"] if made.get("checksum") != checksum else []
    changed += [f"{name} {made.get(name, '?')} -> {version}" for name, version in deps.items()
                if made.get(name) != version]
    return f"again ({', '.join(changed) or 'unknown change'} since {newest.name})"


def prune(target: Path) -> None:
    """Remove the other artefacts of target's engine beside it once unused for KEEP_UNUSED_S, and build folders
    left by killed processes; best effort (another process may be removing them too)."""
    engine = target.name.split("-")[0]
    now = time.time()
    for path in (*target.parent.glob(f"{engine}-*"), *target.parent.glob(f".{engine}-*")):
        limit = DEAD_BUILD_S if path.name.startswith(".") else KEEP_UNUSED_S
        unused = now - last_use(path)
        if path != target and path.is_dir() and unused > limit and last_use(path) > 0:
            shutil.rmtree(path, ignore_errors=True)
            if not path.exists():
                log.info("removed %s (unused for %.0f minutes; %s is the newest)", path, unused / 60, target.name)


def ensure_artefact(checkpoint: Path, engine: Engine, checksum: str, write, verb: str = "exporting",
                    quantization: str = "float32") -> Path:
    """The folder of `engine`'s artefact of the checkpoint (of weight type `quantization`), made by
    `write(folder)` where it is not there yet (one log line says why), marked as used now; older artefacts of
    the engine and weight type that are unused go."""
    deps = dependencies(engine, quantization)
    target, cache = artefact_dir(checkpoint, engine, checksum, deps, quantization), cache_folder(checkpoint)
    tmp = None
    if not target.is_dir() and cache not in target.parents:
        try:
            tmp = build_folder(target)
        except PermissionError:  # where os.access says yes and writing fails: root, ACLs, network drives
            target = cache / target.name
    if not target.is_dir():
        if cache in target.parents:
            beside = checkpoint.parent / f"{checkpoint.name}.engines"
            log.warning("%s is not writable: the %s engine's files go to %s", beside if beside.is_dir() else
                        checkpoint.parent, engine.value, cache)
        log.warning("engine=%s%s: %s %s %s, to %s", engine.value, "" if quantization == "float32" else
                    f" quantization={quantization}", verb, checkpoint, why_new(target, checksum, deps), target)
        record = {"checkpoint": str(checkpoint), "checksum": checksum, **deps}

        def write_all(folder: Path) -> None:
            building = BUILDING.set(target)
            try:
                write(folder)
            finally:
                BUILDING.reset(building)
            (folder / RECORD).write_text(json.dumps(record, indent=2) + "\n")

        build_artefact(target, write_all, tmp)
    try:
        os.utime(target)  # the last use, which prune reads
    except OSError:
        pass
    prune(target)
    return target


def write_graphs(engine: Engine, model, directory: Path, quantization: str = "float32",
                 kept_in: Path | None = None) -> Path:
    """The graphs of onnx or aoti for `model`, written into `directory` (aoti: with int8 linear maps where
    `quantization` is int8); `kept_in`: the folder `directory` becomes, named in aoti's log lines (default: the
    artefact ensure_artefact is building, else `directory`)."""
    if engine == Engine.onnx:
        from relmt.export.onnx import export_onnx

        return export_onnx(model, directory)
    from relmt.export.aoti import export_aoti

    return export_aoti(model, directory, quantization, kept_in=kept_in or BUILDING.get())


def graph_model(engine: Engine, model, checkpoint: Path, checksum: str, threads: int = 0,
                quantization: str = "float32"):
    """The checkpoint's model on the onnx or aoti engine (a relmt.export.graphs.GraphModel), its artefact made
    on first use."""
    target = ensure_artefact(checkpoint, engine, checksum,
                             lambda tmp: write_graphs(engine, model, tmp, quantization), quantization=quantization)
    if engine == Engine.onnx:
        from relmt.export.onnx import OnnxModel

        return OnnxModel(target, threads)
    from relmt.export.aoti import AotiModel

    return AotiModel(target)


def export_checkpoint(checkpoint_path: str | Path, output_dir: str | Path, engine: Engine, force: bool = False,
                      quantization: str = "float32") -> Path:
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
        write_graphs(engine, model, tmp, quantization, kept_in=out)
        (tmp / "sentencepiece.model").write_bytes(tokenizer.model_bytes())
        (tmp / INFO_FILE).write_text(json.dumps({"checkpoint": str(checkpoint_path), "format": engine.value,
                                                 "quantization": quantization,
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

    def __init__(self, checkpoint: Path, checksum: str, converter, threads: int = 0) -> None:
        """`converter` (a relmt.export.ctranslate2.RelmtConverter) holds the weights whose checksum is `checksum`,
        read once from the checkpoint: the file itself is not read again, so a best.pt that training replaces
        meanwhile cannot put other weights under this checksum's name."""
        import ctranslate2

        target = ensure_artefact(checkpoint, Engine.ctranslate2, checksum,
                                 lambda tmp: converter.convert(str(tmp), force=True), verb="converting")
        self.translator = ctranslate2.Translator(str(target), device="cpu", intra_threads=threads or
                                                 torch.get_num_threads())

    def hypotheses(self, ids: list[list[int]], tokenizer, cfg, prefixes: list[list[int]] | None = None) -> list[list]:
        """The cfg.nbest (ids, score) hypotheses of each source (ids without EOS), [] for an empty one; prefixes[i]:
        the ids source i's output begins with (CTranslate2's target_prefix)."""
        from relmt.decode.beam import Hypothesis
        from relmt.export.decoding import decode_options

        todo = [i for i, x in enumerate(ids) if x]
        out: list[list] = [[] for _ in ids]
        if not todo:
            return out
        sp = tokenizer.sp
        pieces = [[sp.id_to_piece(t) for t in ids[i]] for i in todo]
        options = decode_options(cfg, max(len(p) for p in pieces))
        if prefixes is not None and any(prefixes):
            options["target_prefix"] = [[sp.id_to_piece(t) for t in prefixes[i]] or None for i in todo]
        results = self.translator.translate_batch(pieces, return_scores=True, max_batch_size=cfg.max_source_tokens,
                                                  batch_type="tokens", **options)
        for i, result in zip(todo, results):
            out[i] = [Hypothesis([sp.piece_to_id(p) for p in hyp], score)
                      for hyp, score in zip(result.hypotheses, result.scores)]
        return out
