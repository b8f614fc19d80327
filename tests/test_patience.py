"""Early stopping (train.patience): tiny runs on CPU whose validation figures are scripted per step,
so that a sequence that stalls must stop at a known validation and one that improves must not."""

from __future__ import annotations

import json
import math

import pytest

from relmt import checkpoint
from relmt.config import compose
from relmt.train import loop as loop_module
from tests.test_train import tiny_config, train_records


def scripted_validation(monkeypatch, figures: dict[int, float], metric: str = "loss") -> list[int]:
    """Replace validation by `figures` (step -> validation loss, or BLEU with metric="bleu"), logged
    to metrics.jsonl as the real one is. Returns the steps validated, in order."""
    validated: list[int] = []

    def validate(model, corpus, cfg, dist, amp, step, run_log):
        validated.append(step)
        value = figures.get(step, 100.0 if metric == "loss" else 0.0)  # unlisted steps never improve
        valid = {"loss": value if metric == "loss" else 1.0}
        valid.update(nll=valid["loss"], ppl=math.exp(valid["loss"]))
        if metric == "bleu":
            valid["bleu"] = value
        if run_log is not None:
            run_log.record(step, "valid", valid)
        return valid

    monkeypatch.setattr(loop_module, "validate", validate)
    return validated


# step 3 brings no gain, 4 a new best (the count starts again), 5 none and 6 ties the best: no gain
LOSS_STALLS = {1: 5.0, 2: 4.0, 3: 4.5, 4: 3.9, 5: 4.0, 6: 3.9, 7: 1.0}


def test_a_stalling_loss_stops_after_patience_validations_and_the_run_completes(tmp_path, monkeypatch, caplog):
    """Best at step 4; steps 5 and 6 bring nothing new (a tie is no improvement), so patience 2
    stops at step 6, before step 7's gain. The run then ends as one that reached max_steps does:
    last.pt saved, the test splits scored with best.pt, metrics.json written."""
    validated = scripted_validation(monkeypatch, LOSS_STALLS)
    run = tmp_path / "run"
    with caplog.at_level("INFO", logger="relmt.train.loop"):
        metrics = loop_module.train(tiny_config(tmp_path, "run", "train.valid_bleu=false", "train.eval_every=1",
                                                "train.max_steps=20", "train.patience=2"))
    assert validated == list(range(1, 7))
    assert metrics["status"] == "completed" and metrics["steps"] == 6
    stop = {"step": 6, "best_step": 4, "patience": 2, "metric": "loss"}
    assert metrics["stopped_early"] == stop
    assert "early stopping: no improvement of valid loss for 2 validations; best at step 4" in caplog.text
    saved = json.loads((run / "metrics.json").read_text())
    assert saved["stopped_early"] == stop and saved["best"] == {"metric": "loss", "value": 3.9, "step": 4}
    assert set(saved["test"]) == {"test", "test_long"} and saved["test_checkpoint"].endswith("best.pt")
    assert (run / "translations/test.tgt").is_file()
    assert checkpoint.load(run / "checkpoints/last.pt")["step"] == 6
    assert checkpoint.load(run / "checkpoints/best.pt")["step"] == 4
    assert max(train_records(run)) == 6


def test_patience_counts_validations_not_updates(tmp_path, monkeypatch):
    """eval_every=2: the validations at steps 4 and 6 bring no gain, so patience 2 stops at step 6."""
    validated = scripted_validation(monkeypatch, {2: 5.0, 4: 6.0, 6: 5.5, 8: 1.0})
    metrics = loop_module.train(tiny_config(tmp_path, "run", "train.valid_bleu=false", "train.eval_every=2",
                                            "train.max_steps=20", "train.patience=2"))
    assert validated == [2, 4, 6]
    assert metrics["stopped_early"] == {"step": 6, "best_step": 2, "patience": 2, "metric": "loss"}


def test_a_stalling_bleu_stops_at_the_first_validation_without_gain_under_patience_1(tmp_path, monkeypatch):
    scripted_validation(monkeypatch, {1: 10.0, 2: 12.0, 3: 11.0, 4: 15.0}, metric="bleu")
    metrics = loop_module.train(tiny_config(tmp_path, "run", "train.eval_every=1", "train.max_steps=20",
                                            "train.patience=1"))
    assert metrics["steps"] == 3 and metrics["status"] == "completed"
    assert metrics["stopped_early"] == {"step": 3, "best_step": 2, "patience": 1, "metric": "bleu"}
    assert metrics["best"] == {"metric": "bleu", "value": 12.0, "step": 2}


def test_an_improving_metric_never_stops(tmp_path, monkeypatch):
    validated = scripted_validation(monkeypatch, {s: 10.0 - s for s in range(1, 9)})
    metrics = loop_module.train(tiny_config(tmp_path, "run", "train.valid_bleu=false", "train.eval_every=1",
                                            "train.max_steps=8", "train.patience=1"))
    assert validated == list(range(1, 9))
    assert metrics["steps"] == 8 and metrics["stopped_early"] is None and metrics["status"] == "completed"


@pytest.mark.parametrize("patience", ["0", "null"])
def test_patience_off_trains_to_max_steps(tmp_path, monkeypatch, patience):
    scripted_validation(monkeypatch, LOSS_STALLS)
    metrics = loop_module.train(tiny_config(tmp_path, "run", "train.valid_bleu=false", "train.eval_every=1",
                                            "train.max_steps=8", f"train.patience={patience}"))
    assert metrics["steps"] == 8 and metrics["stopped_early"] is None


def test_patience_running_out_at_max_steps_is_no_early_stop(tmp_path, monkeypatch):
    scripted_validation(monkeypatch, {1: 5.0, 2: 6.0, 3: 7.0})
    metrics = loop_module.train(tiny_config(tmp_path, "run", "train.valid_bleu=false", "train.eval_every=1",
                                            "train.max_steps=3", "train.patience=2"))
    assert metrics["steps"] == 3 and metrics["stopped_early"] is None


def test_negative_patience_is_a_config_error_naming_the_key():
    with pytest.raises(ValueError, match=r"train.patience: must be >= 0 \(0 or null = off\), got -1"):
        compose(["train.patience=-1"])
    assert compose(["train.patience=null"]).train.patience is None
    assert compose([]).train.patience == 0


# Best at step 2; steps 3 and 4 bring nothing (2 validations without gain when the first run ends at
# max_steps 4), and neither do 5 and 6.
RESUMED = {1: 5.0, 2: 4.0, 3: 6.0, 4: 7.0, 5: 8.0, 6: 9.0, 7: 10.0}
FIRST = ("train.valid_bleu=false", "train.eval_every=1", "train.save_every=2", "train.patience=3")


def test_the_count_without_improvement_survives_a_resume(tmp_path, monkeypatch):
    """Patience 3: the first run ends at max_steps 4 with 2 validations without gain; the resumed one
    must stop after one more (step 5), not three more (step 7) as a count restarted from 0 would. A
    run that stopped early and resumes with more patience goes on until that runs out too."""
    scripted_validation(monkeypatch, RESUMED)
    run = tmp_path / "run"
    first = loop_module.train(tiny_config(tmp_path, "run", *FIRST, "train.max_steps=4"))
    assert first["stopped_early"] is None and first["steps"] == 4
    assert checkpoint.load(run / "checkpoints/last.pt")["state"]["validations_since_best"] == 2
    resumed = loop_module.train(tiny_config(tmp_path, "run", *FIRST, "train.max_steps=20", "train.resume=true"))
    assert resumed["steps"] == 5 and resumed["status"] == "completed"
    assert resumed["stopped_early"] == {"step": 5, "best_step": 2, "patience": 3, "metric": "loss"}
    assert set(resumed["test"]) == {"test", "test_long"}
    # the same run without the interruption stops at the same validation
    whole = loop_module.train(tiny_config(tmp_path, "whole", *FIRST, "train.max_steps=20"))
    assert whole["stopped_early"] == resumed["stopped_early"]
    # more patience on resume: one validation more (step 6), then it runs out again
    again = loop_module.train(tiny_config(tmp_path, "run", *FIRST[:-1], "train.patience=4", "train.max_steps=20",
                                          "train.resume=true"))
    assert again["stopped_early"] == {"step": 6, "best_step": 2, "patience": 4, "metric": "loss"}


def test_a_checkpoint_saved_before_patience_counts_from_the_metrics_log(tmp_path, monkeypatch):
    """A checkpoint without the count (saved before train.patience existed) takes it from the
    validations metrics.jsonl logged after the best step."""
    scripted_validation(monkeypatch, RESUMED)
    run = tmp_path / "run"
    loop_module.train(tiny_config(tmp_path, "run", *FIRST, "train.max_steps=4"))
    ck = checkpoint.load(run / "checkpoints/last.pt")
    del ck["state"]["validations_since_best"]
    checkpoint.save(ck, run / "checkpoints", ["last.pt"])
    resumed = loop_module.train(tiny_config(tmp_path, "run", *FIRST, "train.max_steps=20", "train.resume=true"))
    assert resumed["stopped_early"] == {"step": 5, "best_step": 2, "patience": 3, "metric": "loss"}
