"""Checkpoint files: checksums, a full disk while saving, clear messages, and averaging one file
at a time."""

from __future__ import annotations

import errno
import io
import logging
import weakref
from pathlib import Path

import pytest
import torch

from relmt import checkpoint
from relmt.cli.average import _average
from relmt.cli.common import EXIT_USER_ERROR, guarded
from relmt.errors import UserError


def fake_payload(value: float, step: int = 1, model_config: dict | None = None, spm_sha: str = "abc") -> dict:
    return {"format": checkpoint.CHECKPOINT_FORMAT, "config": {"model": model_config or {"d_model": 4}},
            "spm": {"sha256": spm_sha}, "step": step,
            "model": {"w": torch.full((2, 3), value), "n": torch.tensor([step])}}


def training_payload() -> dict:
    """Weights and Adam state of a small module after one step, as the trainer saves them."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.Linear(64, 8))
    optim = torch.optim.Adam(model.parameters())
    model(torch.randn(3, 64)).sum().backward()
    optim.step()
    return {"format": checkpoint.CHECKPOINT_FORMAT, "config": {"model": {}}, "spm": {}, "step": 1,
            "model": model.state_dict(), "optim": optim.state_dict(), "rng": [checkpoint.rng_state()]}


def flip(path: Path, at: int, n: int = 64) -> None:
    data = bytearray(path.read_bytes())
    data[at: at + n] = bytes(b ^ 0xFF for b in data[at: at + n])
    path.write_bytes(bytes(data))


# --- checksums -----------------------------------------------------------------------------------------

def test_flipped_bytes_in_the_weights_are_detected_naming_the_file(tmp_path):
    payload = fake_payload(0.0)
    payload["model"]["w"] = torch.arange(4096, dtype=torch.float32)
    checkpoint.save(payload, tmp_path, ["last.pt"])
    raw = payload["model"]["w"].numpy().tobytes()
    start = (tmp_path / "last.pt").read_bytes().find(raw)  # torch stores tensor data uncompressed
    assert start > 0
    flip(tmp_path / "last.pt", start + len(raw) // 2)
    with pytest.raises(UserError, match=r"last\.pt: checksum mismatch"):
        checkpoint.load(tmp_path / "last.pt")


def test_flipped_bytes_in_the_middle_of_a_training_checkpoint_are_detected(tmp_path):
    """The issue's case: 64 bytes flipped in the middle of last.pt (here: optimizer state)."""
    checkpoint.save(training_payload(), tmp_path, ["last.pt"])
    flip(tmp_path / "last.pt", (tmp_path / "last.pt").stat().st_size // 2)
    with pytest.raises(UserError, match=r"last\.pt: "):
        checkpoint.load(tmp_path / "last.pt")


def test_an_intact_checkpoint_round_trips_with_its_checksum(tmp_path):
    payload = training_payload()
    checkpoint.save(payload, tmp_path, ["a.pt", "b.pt"])
    ck = checkpoint.load(tmp_path / "b.pt")
    assert ck["checksum"] == checkpoint.payload_checksum(payload)
    for key, value in payload["model"].items():
        assert torch.equal(ck["model"][key], value)


def test_a_format_1_checkpoint_without_checksum_loads_with_a_warning(tmp_path, caplog):
    old = fake_payload(2.0)
    old["format"] = 1
    torch.save(old, tmp_path / "old.pt")
    with caplog.at_level(logging.WARNING, logger="relmt.checkpoint"):
        ck = checkpoint.load(tmp_path / "old.pt")
    assert torch.equal(ck["model"]["w"], old["model"]["w"])
    assert "old.pt: written before checkpoints carried a checksum" in caplog.text


def test_a_current_format_checkpoint_without_checksum_is_refused(tmp_path):
    torch.save(fake_payload(2.0), tmp_path / "stripped.pt")
    with pytest.raises(UserError, match=r"stripped\.pt: no checksum inside"):
        checkpoint.load(tmp_path / "stripped.pt")


def test_the_corrupt_checkpoint_message_holds_pytorchs_text_once(tmp_path, capsys):
    checkpoint.save(fake_payload(1.0), tmp_path, ["good.pt"])
    data = (tmp_path / "good.pt").read_bytes()
    (tmp_path / "truncated.pt").write_bytes(data[: len(data) // 2])
    code = guarded("relmt-average", _average, [f"checkpoints=[{tmp_path / 'truncated.pt'}]",
                                                f"output={tmp_path / 'avg.pt'}"])
    err = capsys.readouterr().err
    assert code == EXIT_USER_ERROR
    assert "truncated.pt: not a readable checkpoint" in err
    assert err.count("failed finding central directory") == 1, err


# --- a full disk ---------------------------------------------------------------------------------------

class FullDisk(io.FileIO):
    """A file on a disk that fills up after `room` bytes: the write that crosses it stores what
    fits, then fails with ENOSPC, as write(2) does."""

    room = 3000

    def write(self, data: bytes) -> int:
        data = bytes(data)
        free = self.room - self.tell()
        if len(data) > free:
            super().write(data[: max(free, 0)])
            raise OSError(errno.ENOSPC, "No space left on device")
        return super().write(data)


def fill_disk(monkeypatch) -> None:
    """Files checkpoint.py opens for writing land on a FullDisk (open() looks in module globals first)."""
    def fake_open(path, mode="r", *args, **kwargs):
        return FullDisk(path, mode.replace("b", "")) if "w" in mode else open(path, mode, *args, **kwargs)

    monkeypatch.setattr(checkpoint, "open", fake_open, raising=False)


def big_payload(value: float) -> dict:
    payload = fake_payload(value, step=60)
    payload["model"]["w"] = torch.full((64, 64), value)  # 16 kB: more than the disk's room
    return payload


def test_a_full_disk_names_the_file_leaves_no_temp_and_keeps_last(tmp_path, monkeypatch):
    checkpoint.save(fake_payload(1.0), tmp_path, ["step_30.pt", "last.pt"])
    before = (tmp_path / "last.pt").read_bytes()
    fill_disk(monkeypatch)
    with pytest.raises(UserError, match=r"step_60\.pt: could not save the checkpoint: no space left on device"):
        checkpoint.save(big_payload(2.0), tmp_path, ["step_60.pt", "last.pt"])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["last.pt", "step_30.pt"]  # no .step_60.pt.tmp
    assert (tmp_path / "last.pt").read_bytes() == before
    monkeypatch.undo()
    assert torch.equal(checkpoint.load(tmp_path / "last.pt")["model"]["w"], torch.full((2, 3), 1.0))


@pytest.mark.parametrize("free,reason", [(10, "no space left on device"), (10 ** 12, "write failed (disk full?)")])
def test_libtorchs_vague_write_error_is_explained(tmp_path, monkeypatch, free, reason):
    """With a path, libtorch's own writer fails with 'basic_ios::clear: iostream error' and no
    errno; the free space then tells whether the disk was full."""
    def failing_save(obj, f):
        f.write(b"PK" * 500)
        raise RuntimeError("basic_ios::clear: iostream error")

    monkeypatch.setattr(checkpoint.torch, "save", failing_save)
    monkeypatch.setattr(checkpoint.shutil, "disk_usage", lambda path: type("Usage", (), {"free": free})())
    with pytest.raises(UserError) as raised:
        checkpoint.save(big_payload(2.0), tmp_path, ["step_60.pt"])
    assert str(raised.value).startswith(f"{tmp_path / 'step_60.pt'}: could not save the checkpoint: {reason}")
    assert list(tmp_path.iterdir()) == []


def test_relmt_average_on_a_full_disk_exits_non_zero_with_the_message(tmp_path, monkeypatch, capsys):
    for i in range(2):
        checkpoint.save(big_payload(float(i)), tmp_path, [f"step_{i}.pt"])
    fill_disk(monkeypatch)
    code = guarded("relmt-average", _average, [f"dir={tmp_path}", f"output={tmp_path / 'avg.pt'}"])
    err = capsys.readouterr().err
    assert code == EXIT_USER_ERROR
    assert f"{tmp_path / 'avg.pt'}: could not save the checkpoint: no space left on device" in err
    assert "Traceback" not in err and not (tmp_path / ".avg.pt.tmp").exists()


# --- averaging -----------------------------------------------------------------------------------------

def test_the_running_sum_equals_the_float64_mean(tmp_path):
    torch.manual_seed(0)
    weights = [torch.randn(5, 7) * 10 ** i for i in range(4)]  # magnitudes where float32 sums would round
    for i, w in enumerate(weights):
        payload = fake_payload(0.0, step=i)
        payload["model"]["w"] = w
        checkpoint.save(payload, tmp_path, [f"step_{i}.pt"])
    avg = checkpoint.average(checkpoint.step_files(tmp_path))
    expected = (sum(w.to(torch.float64) for w in weights) / len(weights)).to(torch.float32)
    torch.testing.assert_close(avg["model"]["w"], expected, rtol=0, atol=0)
    assert avg["model"]["n"].tolist() == [3]  # integer buffers come from the last checkpoint
    assert avg["model"]["w"].dtype == torch.float32


def test_averaging_holds_one_checkpoint_and_no_optimizer_at_a_time(tmp_path, monkeypatch):
    class Tracked(dict):  # plain dicts cannot be weakly referenced
        pass

    for i in range(4):
        payload = fake_payload(float(i), step=i)
        payload["optim"] = {"state": {0: {"exp_avg": torch.ones(2, 3)}}}
        checkpoint.save(payload, tmp_path, [f"step_{i}.pt"])
    real_load, alive = checkpoint.load, []

    def tracking_load(path, **kwargs):
        assert all(ref() is None for ref in alive), "an earlier checkpoint is still in memory"
        payload = Tracked(real_load(path, **kwargs))
        payload["model"] = Tracked(payload["model"])
        alive.extend([weakref.ref(payload), weakref.ref(payload["model"])])
        return payload

    monkeypatch.setattr(checkpoint, "load", tracking_load)
    avg = checkpoint.average(checkpoint.step_files(tmp_path))
    torch.testing.assert_close(avg["model"]["w"], torch.full((2, 3), 1.5))
    assert "optim" not in avg and len(alive) == 8


@pytest.mark.parametrize("other,message", [
    ({"model_config": {"d_model": 8}}, "its model config differs"),
    ({"spm_sha": "def"}, "trained with another vocabulary"),
])
def test_averaging_refuses_other_models_and_vocabularies(tmp_path, other, message):
    checkpoint.save(fake_payload(1.0, 1), tmp_path, ["step_1.pt"])
    checkpoint.save(fake_payload(2.0, 2, **other), tmp_path, ["step_2.pt"])
    checkpoint.save(fake_payload(3.0, 3), tmp_path, ["step_3.pt"])
    with pytest.raises(UserError, match=rf"step_2\.pt: {message}.*step_1\.pt"):
        checkpoint.average(checkpoint.step_files(tmp_path))
