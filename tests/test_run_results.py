"""A finished run's results survive any rerun (issue 42 §1, §2): a completed run whose checkpoints were
deleted is reported as done or refused, never trained again over its results; train.overwrite=true is
the one way to replace them; metrics.json is written atomically and run_queue.sh does not take a cut-short
one for a completed run; and the saved best names its metric, so a resume that ranks by another figure
starts the best afresh instead of comparing a BLEU with a loss."""

from __future__ import annotations

import errno
import json
import logging
import os
import shutil
import signal
import subprocess
from pathlib import Path

import pytest

from relmt import checkpoint
from relmt.cli.common import EXIT_INTERRUPTED, EXIT_USER_ERROR
from relmt.errors import UserError
from relmt.train import loop as loop_module
from tests.test_lifecycle import ROOT, exit_status, fake_bin, files, job
from tests.test_patience import scripted_validation
from tests.test_train import tiny_config

QUICK = ("train.valid_bleu=false", "train.max_steps=3")


def results(run: Path) -> dict[str, bytes]:
    """Everything in a run directory but its checkpoints and Hydra's files."""
    return {k: v for k, v in files(run).items() if not k.startswith(("checkpoints/", ".hydra/", "train.log"))}


def completed_without_checkpoints(tmp_path: Path) -> Path:
    run = tmp_path / "run"
    assert exit_status(job(tmp_path, "run", *QUICK)) == 0
    shutil.rmtree(run / "checkpoints")  # deleted to free disk: metrics.json, metrics.jsonl and tb/ remain
    return run


# --- 1. a completed run whose checkpoints are gone ------------------------------------------------------

def test_rerunning_a_completed_run_without_checkpoints_refuses_and_keeps_its_results(tmp_path, capsys):
    run = completed_without_checkpoints(tmp_path)
    before = results(run)
    assert json.loads(before["metrics.json"])["status"] == "completed" and "tb" in {k.split("/")[0] for k in before}
    assert exit_status(job(tmp_path, "run", *QUICK)) == EXIT_USER_ERROR
    err = capsys.readouterr().err
    assert "holds a completed run after 3 updates" in err and "train.overwrite=true" in err
    assert results(run) == before


def test_resuming_a_completed_run_without_checkpoints_reports_it_done_and_changes_nothing(tmp_path, caplog):
    run = completed_without_checkpoints(tmp_path)
    before = results(run)
    with caplog.at_level(logging.INFO, "relmt"):
        metrics = loop_module.train(tiny_config(tmp_path, "run", *QUICK, "train.resume=true"))
    assert metrics == json.loads(before["metrics.json"]) and "already completed" in caplog.text
    assert results(run) == before and not (run / "checkpoints").exists()


def test_training_on_a_completed_run_whose_checkpoints_are_gone_is_refused(tmp_path):
    run = completed_without_checkpoints(tmp_path)
    before = results(run)
    with pytest.raises(UserError, match="checkpoints are gone .* cannot be continued"):
        loop_module.train(tiny_config(tmp_path, "run", "train.valid_bleu=false", "train.max_steps=6",
                                      "train.resume=true"))
    assert results(run) == before


def test_a_run_interrupted_after_its_last_update_keeps_its_results_once_its_checkpoints_are_gone(tmp_path,
                                                                                               monkeypatch):
    """A SIGTERM during the final update leaves an interrupted metrics.json (no test scores); without
    its checkpoints nothing can finish it, and a rerun must not wipe it either."""
    real_step, updates = loop_module.train_step, []

    def signalled_at_the_last(*args, **kwargs):
        updates.append(1)
        if len(updates) == 3:
            signal.raise_signal(signal.SIGTERM)
        return real_step(*args, **kwargs)

    monkeypatch.setattr(loop_module, "train_step", signalled_at_the_last)
    run = tmp_path / "run"
    assert exit_status(job(tmp_path, "run", *QUICK)) == EXIT_INTERRUPTED
    monkeypatch.setattr(loop_module, "train_step", real_step)
    shutil.rmtree(run / "checkpoints")
    before = results(run)
    assert json.loads(before["metrics.json"])["status"] == "interrupted"
    for again in [(), ("train.resume=true",)]:
        with pytest.raises(UserError, match="holds an interrupted run after 3 updates"):
            loop_module.train(tiny_config(tmp_path, "run", *QUICK, *again))
        assert results(run) == before, again


def test_a_completed_run_with_checkpoints_is_refused_without_resume_naming_every_way_out(tmp_path):
    loop_module.train(tiny_config(tmp_path, "run", *QUICK))
    with pytest.raises(UserError, match="already holds a run.*train.resume=true.*train.overwrite=true"):
        loop_module.train(tiny_config(tmp_path, "run", *QUICK))


# --- train.overwrite --------------------------------------------------------------------------------------

def test_overwrite_trains_again_from_scratch_replacing_checkpoints_and_results(tmp_path, caplog):
    run = completed_without_checkpoints(tmp_path)
    (run / "checkpoints").mkdir()
    (run / "checkpoints/step_99.pt").write_bytes(b"an earlier run's")
    with caplog.at_level(logging.WARNING, "relmt"):
        metrics = loop_module.train(tiny_config(tmp_path, "run", "train.valid_bleu=false", "train.max_steps=2",
                                                "train.overwrite=true"))
    assert metrics["status"] == "completed" and metrics["steps"] == 2
    assert "train.overwrite=true: removed the earlier run's checkpoints, metrics.json" in caplog.text
    assert not (run / "checkpoints/step_99.pt").exists()
    assert [json.loads(line)["step"] for line in (run / "metrics.jsonl").read_text().splitlines()
            if json.loads(line)["tag"] == "train"] == [1, 2]


def test_overwrite_and_resume_together_are_refused(tmp_path):
    with pytest.raises(UserError, match="train.overwrite=true and train.resume=true"):
        loop_module.train(tiny_config(tmp_path, "run", *QUICK, "train.overwrite=true", "train.resume=true"))


def test_training_a_completed_run_on_to_a_larger_max_steps_keeps_the_old_results(tmp_path):
    run = tmp_path / "run"
    first = loop_module.train(tiny_config(tmp_path, "run", *QUICK))
    first_translation = (run / "translations/test.tgt").read_bytes()
    metrics = loop_module.train(tiny_config(tmp_path, "run", "train.valid_bleu=false", "train.max_steps=5",
                                            "train.resume=true"))
    assert metrics["steps"] == 5 and metrics["status"] == "completed"
    kept = run / "completed_step_3"
    assert json.loads((kept / "metrics.json").read_text()) == first
    assert (kept / "translations/test.tgt").read_bytes() == first_translation


# --- metrics.json is written atomically -------------------------------------------------------------------

def test_write_text_leaves_the_old_file_whole_when_the_disk_fills(tmp_path, monkeypatch):
    path = tmp_path / "metrics.json"
    path.write_text('{"status": "completed"}\n')

    def full(fd):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "fsync", full)
    with pytest.raises(UserError, match=r"metrics\.json: could not save the file: no space left on device"):
        checkpoint.write_text(path, '{"status": "interrupted", "and": "more"}\n')
    assert path.read_text() == '{"status": "completed"}\n'
    assert [p.name for p in tmp_path.iterdir()] == ["metrics.json"]  # no temporary file left behind


def test_train_writes_metrics_json_through_the_atomic_writer(tmp_path, monkeypatch):
    written = []
    real = checkpoint.write_text
    monkeypatch.setattr(checkpoint, "write_text", lambda path, text: (written.append(path.name), real(path, text)))
    loop_module.train(tiny_config(tmp_path, "run", *QUICK))
    assert written == ["metrics.json"]


def test_run_queue_does_not_take_a_cut_short_metrics_json_for_a_completed_run(tmp_path):
    out, kept = tmp_path / "runs", tmp_path / "kept"
    cut = '{\n  "status": "completed",\n  "stopped_early": null,\n  "steps": 3'  # a kill mid-write
    for folder, name in ((out, "cut"), (kept, "kept_cut"), (out, "whole")):
        (folder / name).mkdir(parents=True)
        (folder / name / "metrics.json").write_text(cut if "cut" in name else '{"status": "completed"}\n')
    (out / "cut/checkpoints").mkdir()
    (out / "cut/checkpoints/last.pt").write_text("")
    queue = tmp_path / "q.txt"
    queue.write_text(f"out: {out}\nkeep: {kept}\ncut seed=1\nkept_cut seed=1\nwhole seed=1\n")
    env = {"BIN": str(fake_bin(tmp_path)), "PATH": "/usr/bin:/bin", "JOBS": "1"}
    done = subprocess.run(["bash", str(ROOT / "scripts/reproduce/run_queue.sh"), str(queue)], capture_output=True,
                          text=True, cwd=ROOT, env=env)
    assert done.returncode == 0, done.stderr
    assert "done already: whole" in done.stdout
    trained = {Path(line.split("hydra.run.dir=")[1]).name for line in (tmp_path / "calls").read_text().splitlines()}
    assert trained == {"cut", "kept_cut"}


# --- 2. the saved best names its metric ---------------------------------------------------------------

def test_a_resume_that_ranks_by_bleu_starts_the_best_afresh_instead_of_comparing_it_with_a_loss(
        tmp_path, monkeypatch, caplog):
    run = tmp_path / "run"
    scripted_validation(monkeypatch, {3: 5.62})  # the loss at step 3
    loop_module.train(tiny_config(tmp_path, "run", *QUICK))
    assert json.loads((run / "metrics.json").read_text())["best"] == {"metric": "loss", "value": 5.62, "step": 3}
    scripted_validation(monkeypatch, {6: 2.0}, metric="bleu")  # a BLEU below the saved loss
    with caplog.at_level(logging.WARNING, "relmt"):
        metrics = loop_module.train(tiny_config(tmp_path, "run", "train.max_steps=6", "train.resume=true"))
    assert "the saved best is valid loss 5.62 (step 3) but best.pt is now picked by valid bleu" in caplog.text
    assert metrics["best"] == {"metric": "bleu", "value": 2.0, "step": 6}
    assert checkpoint.load(run / "checkpoints/best.pt")["step"] == 6


def test_a_checkpoint_saved_before_the_best_named_its_metric_reads_it_from_its_config(tmp_path, monkeypatch):
    run = tmp_path / "run"
    scripted_validation(monkeypatch, {3: 5.62})
    loop_module.train(tiny_config(tmp_path, "run", *QUICK))
    last = run / "checkpoints/last.pt"
    ck = checkpoint.load(last)
    del ck["state"]["best_metric"], ck["checksum"]  # as saved by relmt before 2026-11-26
    checkpoint.save(ck, last.parent, ["last.pt"])
    scripted_validation(monkeypatch, {6: 2.0}, metric="bleu")
    metrics = loop_module.train(tiny_config(tmp_path, "run", "train.max_steps=6", "train.resume=true"))
    assert metrics["best"] == {"metric": "bleu", "value": 2.0, "step": 6}
