"""Checkpoints: what they hold, atomic saves, loading with clear errors, and averaging.

A checkpoint is a dict (nanoGPT's habit: the config travels with the weights), saved with
`torch.save` to a temporary file and moved into place with `os.replace`, so a crash never leaves
a half-written `last.pt`. Loading uses `torch.load(weights_only=True)`: no arbitrary pickles.

    format    CHECKPOINT_FORMAT
    model     the model's state_dict
    config    relmt.config.to_dict(Config): enough to rebuild model, data and decoding settings
    spm       {"path", "sha256", "model": bytes}: the sentencepiece model, also embedded
    step, position {"epoch", "batch"}, optim, scaler, rng (one entry per rank), state
"""

from __future__ import annotations

import os
import random
import re
import shutil
from pathlib import Path

import numpy as np
import torch

from relmt.errors import UserError

CHECKPOINT_FORMAT = 1
STEP_FILE = re.compile(r"step_(\d+)\.pt$")


def save(payload: dict, directory: Path, names: list[str]) -> None:
    """Write `payload` once as directory/names[0] and give it the other names as well (hard links
    where the file system allows, else copies), each one atomically."""
    directory.mkdir(parents=True, exist_ok=True)
    first = directory / names[0]
    tmp = directory / f".{names[0]}.tmp"
    torch.save(payload, tmp)
    os.replace(tmp, first)
    for name in names[1:]:
        tmp = directory / f".{name}.tmp"
        tmp.unlink(missing_ok=True)
        try:
            os.link(first, tmp)
        except OSError:
            shutil.copyfile(first, tmp)
        os.replace(tmp, directory / name)


def load(path: str | Path) -> dict:
    """Read a checkpoint onto the CPU, or raise a UserError saying what is wrong with the file."""
    path = Path(path)
    if not path.is_file():
        raise UserError(f"{path}: no such checkpoint")
    try:
        payload = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # noqa: BLE001 - any failure to parse the bytes means the same thing
        raise UserError(f"{path}: not a readable checkpoint (corrupt or truncated?): {e}") from None
    if not isinstance(payload, dict) or "model" not in payload or "config" not in payload:
        raise UserError(f"{path}: not a relmt checkpoint (no model and config inside)")
    if payload.get("format") != CHECKPOINT_FORMAT:
        raise UserError(f"{path}: checkpoint format {payload.get('format')}, this relmt reads "
                        f"format {CHECKPOINT_FORMAT}")
    return payload


def load_model_state(model: torch.nn.Module, state: dict, path: str | Path) -> None:
    """load_state_dict, with a mismatch reported as the user's problem, naming the file."""
    try:
        model.load_state_dict(state)
    except RuntimeError as e:
        first = str(e).strip().splitlines()[:4]
        raise UserError(f"{path}: weights do not fit the configured model: {' '.join(first)}") from None


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
    and vocabulary (Shaw et al. §4.1: the big model averages its last 20 checkpoints)."""
    if not paths:
        raise UserError("no checkpoints to average")
    payloads = [load(p) for p in paths]
    keys = payloads[-1]["model"].keys()
    for p, payload in zip(paths, payloads):
        if payload["model"].keys() != keys:
            raise UserError(f"{p}: its weights differ in names from {paths[-1]}; cannot average")
    model = {}
    for key in keys:
        last = payloads[-1]["model"][key]
        if last.is_floating_point():
            total = sum(payload["model"][key].to(torch.float64) for payload in payloads)
            model[key] = (total / len(payloads)).to(last.dtype)
        else:
            model[key] = last
    out = {k: v for k, v in payloads[-1].items() if k in ("format", "config", "spm", "step")}
    out.update(model=model, averaged=[str(p) for p in paths])
    return out
