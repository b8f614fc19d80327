"""The life of a run directory (issue 29 §4): what a refused command leaves behind, how a run stopped
during its final update or its test decoding is finished by a resume, what a fresh start in a
directory without checkpoints does to the old logs, which resumes are refused, and the final
update's step checkpoint."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
from pathlib import Path

import pytest
import torch

from relmt import checkpoint
from relmt.cli.common import EXIT_INTERRUPTED, EXIT_USER_ERROR
from relmt.cli.train import _train_job
from relmt.config import compose
from relmt.errors import UserError
from relmt.train import distributed, finish
from relmt.train import loop as loop_module
from tests.test_train import no_data, tiny_config, train_records
from tests.test_train_cli import TINY, cli

ROOT = Path(__file__).parents[1]


def job(tmp_path: Path, run: str, *overrides: str):
    """The config `relmt-train` hands its Hydra task, for a run in tmp_path/run (which Hydra creates
    before the task starts)."""
    from omegaconf import OmegaConf

    cfg = compose([*TINY, f"data.cache_dir={tmp_path / 'cache'}", *overrides])
    cfg.out_dir = str(tmp_path / run)
    (tmp_path / run).mkdir(exist_ok=True)
    return OmegaConf.structured(cfg)


def exit_status(dcfg) -> int:
    """relmt-train's exit status for the task `dcfg`."""
    try:
        _train_job(dcfg)
    except SystemExit as e:
        return e.code
    return 0


def files(run: Path) -> dict[str, bytes]:
    return {str(p.relative_to(run)): p.read_bytes() for p in sorted(run.rglob("*")) if p.is_file()}


def valid_record(run: Path, step: int) -> dict:
    """The validation figures metrics.jsonl logged at `step`."""
    record = dict(train_records(run, "valid")[step])
    del record["step"], record["tag"]
    return record


# --- 1. a refused command changes nothing --------------------------------------------------------------

def test_a_refused_command_leaves_the_run_directory_as_it_was(tmp_path):
    """config.yaml is what the report reads: a refused command must not replace it."""
    common = ("train.valid_bleu=false", "train.max_steps=3")
    assert exit_status(job(tmp_path, "run", *common)) == 0
    before = files(tmp_path / "run")
    assert "config.yaml" in before
    for refused in [("model.d_model=48",),  # a forgotten train.resume=true
                    ("train.resume=true", "model.d_model=48")]:  # a resume that changes the model
        assert exit_status(job(tmp_path, "run", *common, *refused)) == EXIT_USER_ERROR
        assert files(tmp_path / "run") == before, refused


@pytest.mark.parametrize("override", ["decode.beam=0", "train.max_steps=-1"])
def test_a_command_refused_before_training_leaves_no_new_run_directory(tmp_path, override):
    done = cli(tmp_path, "new", override)
    assert done.returncode == EXIT_USER_ERROR, done.stderr
    assert not (tmp_path / "new").exists()


# --- 2. SIGTERM during the final update --------------------------------------------------------------

def test_sigterm_during_the_final_update_exits_interrupted_and_a_resume_scores_the_tests(tmp_path, monkeypatch):
    real_step, updates = loop_module.train_step, []

    def signalled_at_the_last(*args, **kwargs):
        updates.append(1)
        if len(updates) == 6:  # train=debug: max_steps=6
            signal.raise_signal(signal.SIGTERM)
        return real_step(*args, **kwargs)

    monkeypatch.setattr(loop_module, "train_step", signalled_at_the_last)
    run = tmp_path / "run"
    assert exit_status(job(tmp_path, "run")) == EXIT_INTERRUPTED
    metrics = json.loads((run / "metrics.json").read_text())
    assert metrics["status"] == "interrupted" and metrics["steps"] == 6 and "test" not in metrics
    monkeypatch.setattr(loop_module, "train_step", real_step)
    assert exit_status(job(tmp_path, "run", "train.resume=true")) == 0
    metrics = json.loads((run / "metrics.json").read_text())
    assert metrics["status"] == "completed" and metrics["steps"] == 6
    assert set(metrics["test"]) == {"test", "test_long"} and (run / "translations/test.tgt").is_file()
    assert metrics["final_valid"] == valid_record(run, 6)
    assert [r["step"] for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines())
            if r["tag"] == "train"] == list(range(1, 7))


def fake_bin(tmp_path: Path) -> Path:
    """relmt-prepare that does nothing and relmt-train that records its arguments, for run_queue.sh."""
    folder = tmp_path / "bin"
    folder.mkdir()
    (folder / "relmt-prepare").write_text("#!/bin/sh\n")
    (folder / "relmt-train").write_text(f'#!/bin/sh\necho "$@" >> {tmp_path / "calls"}\n')
    for script in folder.iterdir():
        script.chmod(0o755)
    return folder


def test_run_queue_resumes_a_run_with_a_checkpoint_and_skips_only_completed_ones(tmp_path):
    """An interrupted run writes metrics.json too (status interrupted): the queue must resume it, as
    it must a run cut off between its first step_N.pt and last.pt. A completed run kept in git is done
    even where runs/ is gone (a fresh machine)."""
    out = tmp_path / "runs"
    layouts = {"done": {"metrics.json": '{"status": "completed"}'},
               "stopped": {"metrics.json": '{"status": "interrupted"}', "checkpoints/last.pt": ""},
               "cut": {"checkpoints/step_3.pt": ""}, "new": {}}
    for name, layout in layouts.items():
        for path, text in layout.items():
            (out / name / path).parent.mkdir(parents=True, exist_ok=True)
            (out / name / path).write_text(text)
    # kept in git by an earlier machine (no runs/ here): done; kept but interrupted: trained
    kept = tmp_path / "kept"
    for name, status in {"kept": "completed", "kept_cut": "interrupted"}.items():
        (kept / name).mkdir(parents=True)
        (kept / name / "metrics.json").write_text(f'{{"status": "{status}"}}')
    queue = tmp_path / "q.txt"
    queue.write_text(f"out: {out}\nkeep: {kept}\n"
                     + "".join(f"{name} seed=1\n" for name in [*layouts, "kept", "kept_cut"]))
    env = {"BIN": str(fake_bin(tmp_path)), "PATH": "/usr/bin:/bin", "JOBS": "1"}
    done = subprocess.run(["bash", str(ROOT / "scripts/reproduce/run_queue.sh"), str(queue)], capture_output=True,
                          text=True, cwd=ROOT, env=env)
    assert done.returncode == 0, done.stderr
    assert "done already: done" in done.stdout and "kept already: kept " in done.stdout
    calls = {Path(line.split("hydra.run.dir=")[1]).name: line
             for line in (tmp_path / "calls").read_text().splitlines()}
    assert {name: "train.resume=true" in line for name, line in calls.items()} == {
        "stopped": True, "cut": True, "new": False, "kept_cut": False}
    # KEEP_AGAIN=1 trains a kept run again
    again = subprocess.run(["bash", str(ROOT / "scripts/reproduce/run_queue.sh"), str(queue), "kept"],
                           capture_output=True, text=True, cwd=ROOT, env={**env, "KEEP_AGAIN": "1"})
    assert again.returncode == 0, again.stderr
    assert (tmp_path / "calls").read_text().splitlines()[-1].endswith(f"hydra.run.dir={out / 'kept'}")


# --- 3. killed while decoding the test sets ------------------------------------------------------------

def test_a_run_killed_while_scoring_the_tests_keeps_its_final_validation_on_resume(tmp_path, monkeypatch):
    def killed(*args, **kwargs):
        raise RuntimeError("killed while decoding the test sets")

    monkeypatch.setattr(finish, "score_tests", killed)
    with pytest.raises(RuntimeError, match="killed"):
        loop_module.train(tiny_config(tmp_path, "run"))
    monkeypatch.undo()
    run = tmp_path / "run"
    metrics = loop_module.train(tiny_config(tmp_path, "run", "train.resume=true"))
    assert metrics["status"] == "completed" and set(metrics["test"]) == {"test", "test_long"}
    assert metrics["final_valid"] == valid_record(run, 6) and "bleu" in metrics["final_valid"]
    assert json.loads((run / "metrics.json").read_text())["final_valid"] == valid_record(run, 6)


# --- 4. a fresh start in a directory without checkpoints ------------------------------------------------

def event_steps(tb: Path, tag: str) -> list[int]:
    """The steps of every `tag` event in the TensorBoard files under tb, in file order."""
    from tensorboard.backend.event_processing.event_file_loader import EventFileLoader

    return [event.step for path in sorted(tb.glob("events.*")) for event in EventFileLoader(str(path)).Load()
            if any(v.tag == tag for v in event.summary.value)]


def test_a_fresh_start_after_a_run_killed_before_its_first_checkpoint_logs_each_step_once(tmp_path):
    run = tmp_path / "run"
    common = ("train.valid_bleu=false", "train.eval_every=100", "train.save_every=100")
    loop_module.train(tiny_config(tmp_path, "run", "train.max_steps=3", *common))
    shutil.rmtree(run / "checkpoints")  # as if killed before its first save: logs, no checkpoint
    (run / "metrics.json").unlink()
    loop_module.train(tiny_config(tmp_path, "run", "train.max_steps=5", *common))
    steps = [r["step"] for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines())]
    assert steps == [1, 2, 3, 4, 5, 5]  # five updates, then the final validation
    assert event_steps(run / "tb", "train/loss") == [1, 2, 3, 4, 5]


def test_a_step_checkpoint_without_last_pt_is_a_run_that_needs_train_resume(tmp_path):
    """A run cut off between writing its first step_N.pt and linking last.pt is resumed from the
    step file; a fresh start there would silently throw its updates away."""
    run = tmp_path / "run"
    loop_module.train(tiny_config(tmp_path, "run", "train.valid_bleu=false", "train.max_steps=3"))
    (run / "checkpoints/last.pt").unlink()
    with pytest.raises(UserError, match="already holds a run.*train.resume=true"):
        loop_module.train(tiny_config(tmp_path, "run", "train.valid_bleu=false", "train.max_steps=6"))


# --- 5. what a resume compares: the data's content and the number of ranks ------------------------------

def text_corpus(folder: Path) -> Path:
    folder.mkdir()
    words = ["the cat sits", "a dog runs", "the bird sings", "two cats sleep", "one dog barks"]
    for split, n in (("train", 60), ("valid", 4), ("test", 4)):
        for lang in ("en", "de"):
            (folder / f"{split}.{lang}").write_text("".join(words[i % 5] + "\n" for i in range(n)))
    return folder


def test_resume_accepts_the_same_corpus_at_another_path_and_refuses_another_corpus(tmp_path, monkeypatch):
    common = ("data=text", "data.vocab_size=20", "data.spm_model_type=word", "train.valid_bleu=false")
    first = text_corpus(tmp_path / "first")
    loop_module.train(tiny_config(tmp_path, "run", *common, f"data.dir={first}", "train.max_steps=3"))
    moved = shutil.copytree(first, tmp_path / "moved")  # the same files, elsewhere (new inodes and times)
    metrics = loop_module.train(tiny_config(tmp_path, "run", *common, f"data.dir={moved}", "train.max_steps=6",
                                            "train.resume=true"))
    assert metrics["status"] == "completed" and metrics["steps"] == 6
    with (moved / "train.de").open("a") as f:
        f.write("a changed corpus\n")
    with (moved / "train.en").open("a") as f:
        f.write("a changed corpus\n")
    no_data(monkeypatch)
    with pytest.raises(UserError, match=f"last.pt: cannot resume: the data in data.dir={moved} differs from "
                                        "the saved run's"):
        loop_module.train(tiny_config(tmp_path, "run", *common, f"data.dir={moved}", "train.max_steps=8",
                                      "train.resume=true"))


def test_resume_refuses_another_number_of_ranks(tmp_path, monkeypatch):
    loop_module.train(tiny_config(tmp_path, "run", "train.valid_bleu=false", "train.max_steps=3"))
    monkeypatch.setattr(distributed, "setup", lambda device, timeout: distributed.Dist(0, 2, torch.device("cpu")))
    no_data(monkeypatch)
    with pytest.raises(UserError, match=r"last.pt: cannot resume on 2 ranks \(saved on 1\)"):
        loop_module.train(tiny_config(tmp_path, "run", "train.valid_bleu=false", "train.max_steps=6",
                                      "train.resume=true"))


# --- 6. the final update's step checkpoint -------------------------------------------------------------

def test_average_last_includes_the_final_update_when_save_every_does_not_divide_max_steps(tmp_path):
    run = tmp_path / "run"
    metrics = loop_module.train(tiny_config(tmp_path, "run", "train.valid_bleu=false", "train.max_steps=5",
                                            "train.save_every=3", "train.keep_last=2", "train.average_last=2"))
    assert [os.path.basename(p) for p in metrics["averaged"]] == ["step_3.pt", "step_5.pt"]
    assert checkpoint.load(run / "checkpoints/step_5.pt")["step"] == 5
