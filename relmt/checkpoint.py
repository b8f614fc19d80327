"""Checkpoints: what they hold, atomic saves, loading with clear errors, and averaging. Training
saves, resumes and averages them; translation only loads them, so this module stands below both
(STYLE.md §3) and imports neither.

A checkpoint is a dict (nanoGPT's habit: the config travels with the weights), saved with
`torch.save` to a temporary file, fsynced and moved into place with `os.replace`, so a crash or a
full disk never leaves a half-written `last.pt`. Loading uses `torch.load(weights_only=True)`: no
arbitrary pickles, and it verifies a sha256 of the whole payload, so a flipped byte is an error
rather than silently different weights.

    format    CHECKPOINT_FORMAT
    model     the model's state_dict
    config    relmt.config.to_dict(Config): enough to rebuild model, data and decoding settings
    spm       {"path", "sha256", "model": bytes}: the sentencepiece model, also embedded
    step, position {"epoch", "batch"}, optim, scaler, rng (one entry per rank), state
    batches   {"data": the data's cache key, "world_size"}: what a resume compares besides the config
    checksum  payload_checksum() of everything else (from format 2)
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import logging
import os
import random
import re
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import BinaryIO

import numpy as np
import torch

from relmt.errors import UserError

log = logging.getLogger(__name__)

# Format 2 adds "checksum"; format 1 files (no checksum) still load, with a warning.
CHECKPOINT_FORMAT = 2
READABLE_FORMATS = (1, 2)
STEP_FILE = re.compile(r"step_(\d+)\.pt$")


# --- checksum -------------------------------------------------------------------------------------------

def _tokens(value: object) -> Iterator[bytes | torch.Tensor]:
    """The payload as a stream of bytes and tensors, in insertion order (torch.load keeps it), with
    the structure (lengths, dtypes, shapes) spelled out so that a changed shape changes the stream."""
    if isinstance(value, torch.Tensor):
        yield f"tensor {value.dtype} {tuple(value.shape)}\n".encode()
        yield value
    elif isinstance(value, dict):
        yield f"dict {len(value)}\n".encode()
        for k, v in value.items():
            yield from _tokens(k)
            yield from _tokens(v)
    elif isinstance(value, (list, tuple)):  # one kind: lists and tuples may swap through a config round trip
        yield f"seq {len(value)}\n".encode()
        for v in value:
            yield from _tokens(v)
    elif isinstance(value, (bytes, bytearray)):
        yield f"bytes {len(value)}\n".encode()
        yield bytes(value)
    else:
        yield f"{type(value).__name__} {value!r}\n".encode()


def payload_checksum(payload: dict) -> str:
    """sha256 over everything in the payload but the checksum itself: weights, optimizer, RNG,
    config and vocabulary. torch.load does not check the zip's CRCs, so without this a flipped byte
    in the tensor data loads silently as different weights."""
    h = hashlib.sha256()
    for token in _tokens({k: v for k, v in payload.items() if k != "checksum"}):
        if isinstance(token, torch.Tensor):  # raw bytes, one tensor at a time (a GPU tensor is copied)
            token = token.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy()
        h.update(token)
    return h.hexdigest()


def _payload_bytes(payload: dict) -> int:
    """About how many bytes torch.save writes for `payload` (its tensors; the rest is small)."""
    return sum(t.nbytes for t in _tokens(payload) if isinstance(t, torch.Tensor))


def _verify(payload: dict, path: Path) -> None:
    stored = payload.get("checksum")
    if stored is None and payload["format"] == 1:
        log.warning("%s: written before checkpoints carried a checksum (format 1); its bytes are not "
                    "verified", path)
    elif stored is None:
        raise UserError(f"{path}: no checksum inside (damaged?); use another checkpoint")
    elif stored != payload_checksum(payload):
        raise UserError(f"{path}: checksum mismatch: the file changed after it was saved (a corrupt disk "
                        "or copy); use another checkpoint, e.g. an older step_N.pt")


# --- saving ---------------------------------------------------------------------------------------------

def save(payload: dict, directory: Path, names: list[str]) -> None:
    """Write `payload` (with its checksum added) once as directory/names[0] and give it the other
    names as well (hard links where the file system allows, else copies), each one atomically and
    durably: a crash or a full disk leaves every existing checkpoint as it was."""
    directory.mkdir(parents=True, exist_ok=True)
    payload = {**payload, "checksum": payload_checksum(payload)}
    first = directory / names[0]
    need = _payload_bytes(payload)
    _write(first, lambda f: torch.save(payload, f), need)
    for name in names[1:]:
        _link_or_copy(first, directory / name, need)
    _fsync_dir(directory)


class _KeepOSError:
    """A file wrapper for torch.save. libtorch turns a failed write into a vague RuntimeError
    ("unexpected pos", "basic_ios::clear: iostream error"); this keeps the OSError and its errno."""

    def __init__(self, file: BinaryIO) -> None:
        self.file, self.error = file, None

    def write(self, data: bytes) -> int:
        try:
            return self.file.write(data)
        except OSError as e:
            self.error = e
            raise

    def flush(self) -> None:
        self.file.flush()


def write_text(path: Path, text: str) -> None:
    """`text` into `path` atomically and durably, as checkpoints are written (temporary file, fsync,
    rename): a kill or a full disk leaves the old file whole, never a cut-short one (metrics.json)."""
    data = text.encode()
    _write(path, lambda out: out.write(data), len(data), "the file")
    _fsync_dir(path.parent)


def _write(path: Path, write: Callable[[_KeepOSError], None], need: int, what: str = "the checkpoint") -> None:
    """write(file) into a temporary file, fsync it and rename it to `path`."""
    tmp = path.with_name(f".{path.name}.tmp")
    out: _KeepOSError | None = None
    failure: BaseException | None = None
    try:
        with open(tmp, "wb") as f:
            out = _KeepOSError(f)
            write(out)
            f.flush()
            os.fsync(f.fileno())  # the bytes are on disk before the name points at them
        os.replace(tmp, path)
    except (OSError, RuntimeError) as e:
        failure = (out.error if out is not None else None) or e
    except BaseException:  # e.g. a second Ctrl-C: leave no partial file behind
        tmp.unlink(missing_ok=True)
        raise
    if failure is not None:  # raised outside the except block, so the message is not chained to it
        tmp.unlink(missing_ok=True)
        raise _save_error(path, failure, need, what)


def _link_or_copy(first: Path, target: Path, need: int) -> None:
    tmp = target.with_name(f".{target.name}.tmp")
    tmp.unlink(missing_ok=True)
    try:
        os.link(first, tmp)
    except OSError:  # no hard links here (some network and FAT file systems): copy the bytes
        _write(target, lambda out: _copy_into(first, out), need)
        return
    failure: OSError | None = None
    try:
        os.replace(tmp, target)
    except OSError as e:
        failure = e
    if failure is not None:
        tmp.unlink(missing_ok=True)
        raise _save_error(target, failure, need)


def _copy_into(source: Path, out: _KeepOSError) -> None:
    with open(source, "rb") as f:
        while chunk := f.read(1 << 24):
            out.write(chunk)


def _fsync_dir(directory: Path) -> None:
    """Make the renames durable: a file's name lives in its directory."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:  # directories cannot be opened on every platform; the data itself is synced
        return
    try:
        os.fsync(fd)
    except OSError:  # some file systems (e.g. network mounts) do not sync directories
        pass
    finally:
        os.close(fd)


def _save_error(path: Path, error: BaseException, need: int, what: str = "the checkpoint") -> UserError:
    """A message that names the file and, where it can be told, the cause."""
    try:
        free: int | None = shutil.disk_usage(path.parent).free
    except OSError:
        free = None
    space = "" if free is None else f" ({free / 1e6:.1f} MB free, about {need / 1e6:.1f} MB needed)"
    if isinstance(error, OSError) and error.errno in (errno.ENOSPC, errno.EDQUOT):
        reason = "no space left on device" if error.errno == errno.ENOSPC else "disk quota exceeded"
    elif free is not None and free < need:
        reason = "no space left on device"
    elif isinstance(error, OSError):
        reason = error.strerror or str(error)
    else:  # libtorch's text says neither file nor cause; its first line helps a bug report
        detail = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        reason = f"write failed (disk full?): {detail}"
    kept = "the checkpoints saved before" if what == "the checkpoint" else "the files"
    return UserError(f"{path}: could not save {what}: {reason}{space}; {kept} in {path.parent} are unchanged")


# --- loading --------------------------------------------------------------------------------------------

def resolve(path: str | Path) -> Path:
    """A checkpoint file from what a user passes: the file itself, or a run directory or its
    checkpoints/ folder, which stand for the run's train.test_checkpoint (from its config.yaml), else
    best.pt, else last.pt; the choice is logged."""
    path = Path(path)
    if not path.is_dir():
        if not path.exists() and "," in str(path):
            raise UserError(f"{path}: no such checkpoint; for an ensemble, list the checkpoints in brackets: "
                            f"checkpoint=[{','.join(p.strip() for p in str(path).split(','))}]")
        return path
    folder = path / "checkpoints" if (path / "checkpoints").is_dir() else path
    rule = None
    if (config := folder.parent / "config.yaml").is_file():
        import yaml

        with contextlib.suppress(yaml.YAMLError, AttributeError, TypeError):
            rule = yaml.safe_load(config.read_text(encoding="utf-8"))["train"]["test_checkpoint"]
    for name, why in ((rule, "the run's train.test_checkpoint"), ("best", "the best validation"),
                      ("last", "the final update")):
        if name and (folder / f"{name}.pt").is_file():
            log.info("%s is a directory: using %s (%s)", path, folder / f"{name}.pt", why)  # documented: no warning
            return folder / f"{name}.pt"
    raise UserError(f"{path}: a directory without best.pt or last.pt; pass a checkpoint file, e.g. "
                    f"checkpoint={folder / 'best.pt'}")


# torch.save writes a zip archive (b"PK"); before torch 1.6 a pickle (protocol 2+ starts with 0x80)
TORCH_FILE_STARTS = (b"PK\x03\x04", b"\x80")


def load(path: str | Path, mmap: bool = False) -> dict:
    """Read a checkpoint onto the CPU and verify its checksum, or raise a UserError saying what is
    wrong with the file. mmap=True maps the tensors from the file instead of reading them into
    memory, so the parts a caller drops (e.g. the optimizer, when averaging) never take RAM.
    A run directory stands for its checkpoint (`resolve`)."""
    path = resolve(path)
    if not path.is_file():
        raise UserError(f"{path}: no such checkpoint")
    with open(path, "rb") as f:
        start = f.read(4)
    if not start.startswith(TORCH_FILE_STARTS):
        if path.suffix == ".pt":
            raise UserError(f"{path}: not a readable checkpoint (corrupt or truncated?): it does not begin as a "
                            "file torch.save writes")
        raise UserError(f"{path}: not a relmt checkpoint (not a file torch.save writes); a checkpoint is a "
                        ".pt file in a run's checkpoints/ folder")
    problem = None
    try:
        payload = torch.load(path, map_location="cpu", weights_only=True, mmap=mmap)
    except Exception as e:  # noqa: BLE001 - any failure to parse the bytes means the same thing
        problem = (str(e).strip() or repr(e)).splitlines()[0]
        if problem.startswith("Weights only load failed"):  # torch's advice (weights_only=False) is not ours
            raise UserError(f"{path}: not a relmt checkpoint (it holds Python objects, not only tensors and "
                            "plain values)") from None
    if problem is not None:  # raised outside the except block, so that torch's text appears once
        raise UserError(f"{path}: not a readable checkpoint (corrupt or truncated?): {problem}")
    if not isinstance(payload, dict) or "model" not in payload or "config" not in payload:
        raise UserError(f"{path}: not a relmt checkpoint (no model and config inside)")
    if payload.get("format") not in READABLE_FORMATS:
        raise UserError(f"{path}: checkpoint format {payload.get('format')}, this relmt reads "
                        f"formats {', '.join(map(str, READABLE_FORMATS))}")
    _verify(payload, path)
    return payload


def load_model_state(model: torch.nn.Module, state: dict, path: str | Path) -> None:
    """load_state_dict, with a mismatch reported as the user's problem, naming the file."""
    problem = None
    try:
        model.load_state_dict(state)
    except RuntimeError as e:
        problem = " ".join(str(e).strip().splitlines()[:4])
    if problem is not None:  # raised outside the except block, so that torch's text appears once
        raise UserError(f"{path}: weights do not fit the configured model: {problem}")


def step_files(directory: Path) -> list[Path]:
    """checkpoints/step_N.pt files, oldest first."""
    found = [(int(m.group(1)), p) for p in directory.glob("step_*.pt") if (m := STEP_FILE.search(p.name))]
    return [p for _, p in sorted(found)]


def prune(directory: Path, keep: int) -> None:
    """Delete all but the newest `keep` step_N.pt files (keep=0 keeps none)."""
    files = step_files(directory)
    for p in files[: max(len(files) - keep, 0)]:
        p.unlink(missing_ok=True)


def rng_state() -> dict:
    state = {"torch": torch.get_rng_state(), "python": random.getstate()}
    np_state = np.random.get_state()
    state["numpy"] = (np_state[0], np_state[1].tolist(), *np_state[2:])
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict) -> None:
    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    kind, keys, *rest = state["numpy"]
    np.random.set_state((kind, np.asarray(keys, dtype=np.uint32), *rest))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def average(paths: list[Path]) -> dict:
    """The mean of the checkpoints' weights (in float64, cast back), with the last one's config
    and vocabulary (Shaw et al. §4.1: the big model averages its last 20 checkpoints).

    A running float64 sum and one checkpoint's weights are in memory at a time; the files are
    memory-mapped and their optimizer states are never used, so they take no RAM."""
    if not paths:
        raise UserError("no checkpoints to average")
    first: dict | None = None  # the first file's weight names, model config and vocabulary
    total: dict[str, torch.Tensor] = {}  # float64 sums of floating-point weights; other buffers as is
    dtypes: dict[str, torch.dtype] = {}
    meta: dict = {}
    for path in paths:
        weights, meta = _weights(path)
        if first is None:
            first = {"path": path, "keys": set(weights), "model": meta["config"].get("model"),
                     "spm": meta.get("spm", {}).get("sha256")}
        _check_same_model(path, weights, meta, first)
        for key, value in weights.items():
            dtypes[key] = value.dtype
            if not value.is_floating_point():
                total[key] = value  # integer buffers come from the last checkpoint
            elif key in total:
                total[key].add_(value)
            else:
                total[key] = value.to(torch.float64, copy=True)
        del weights  # before the next file is mapped
    model = {}
    for key in list(total):
        value = total.pop(key)  # frees each sum as soon as it is averaged
        model[key] = (value / len(paths)).to(dtypes[key]) if dtypes[key].is_floating_point else value
    out = {k: v for k, v in meta.items() if k in ("config", "spm", "step")}
    out.update(format=CHECKPOINT_FORMAT, model=model, averaged=[str(p) for p in paths])
    return out


def _weights(path: Path) -> tuple[dict, dict]:
    """A checkpoint's weights and its format/config/spm/step; the rest (optimizer, RNG) is dropped
    on return."""
    payload = load(path, mmap=True)
    return payload["model"], {k: payload[k] for k in ("format", "config", "spm", "step") if k in payload}


def _check_same_model(path: Path, weights: dict, meta: dict, first: dict) -> None:
    """Averaging weights of different models or vocabularies gives a checkpoint that loads but
    translates garbage; refuse it, naming the file."""
    if set(weights) != first["keys"]:
        raise UserError(f"{path}: its weights differ in names from {first['path']}; cannot average")
    if meta["config"].get("model") != first["model"]:
        raise UserError(f"{path}: its model config differs from {first['path']}'s; cannot average "
                        "checkpoints of different models")
    if meta.get("spm", {}).get("sha256") != first["spm"]:
        raise UserError(f"{path}: trained with another vocabulary than {first['path']}; cannot average")
