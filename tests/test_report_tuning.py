"""relmt-report kind=tuning: runs compared on the validation split, by the settings they differ in."""

from __future__ import annotations

import json

import yaml

from relmt.cli.report import main


def fake_run(root, name: str, dropout: float, curve: list[tuple[int, float]], final: float) -> None:
    run = root / name
    run.mkdir(parents=True)
    cfg = {"model": {"name": "mmt_tiny", "d_model": 128, "dropout": dropout, "positions": "rel",
                     "max_relative_position": 16, "relative_keys": True, "relative_values": True},
           "data": {"name": "multi30k_text", "dir": f"/somewhere/{name}", "src": "en", "tgt": "de"},
           "train": {"peak_lr": 0.005, "num_threads": 1}, "decode": {"beam": 4}, "seed": 1, "out_dir": str(run)}
    (run / "config.yaml").write_text(yaml.safe_dump(cfg))
    (run / "metrics.json").write_text(json.dumps({
        "status": "completed", "wall_seconds": 1800.0, "test": {},
        "final_valid": {"bleu": final, "chrf": 60.0, "lowercased_bleu": final + 3}}))
    (run / "metrics.jsonl").write_text("".join(json.dumps({"step": s, "tag": "valid", "bleu": b, "loss": 3.0}) + "\n"
                                               for s, b in curve))


def test_tuning_table_shows_the_differing_settings_and_the_valid_curves(tmp_path, capsys):
    fake_run(tmp_path / "runs", "r1_drop0.3", 0.3, [(500, 14.4), (1000, 30.2)], 35.0)
    fake_run(tmp_path / "runs", "r1_drop0.1", 0.1, [(500, 20.2), (1000, 32.5)], 36.5)
    (tmp_path / "runs" / "r1_drop0.1" / "averaged_valid.json").write_text(json.dumps({"sacrebleu": {"score": 37.25}}))
    assert main([str(tmp_path / "runs"), f"out={tmp_path / 'out'}", "name=tune", "kind=tuning"]) == 0
    text = (tmp_path / "out" / "tune.md").read_text()
    assert "| run | model.dropout | valid BLEU @500 | valid BLEU @1000 |" in text
    assert "| r1_drop0.1 | 0.1 | 20.20 | 32.50 | 36.50 | 60.00 | 39.50 | 37.25 | 30 |" in text
    assert "| r1_drop0.3 | 0.3 | 14.40 | 30.20 | 35.00 | 60.00 | 38.00 | – | 30 |" in text
    assert "data.dir" not in text and "threads" not in text  # not choices being tuned
    assert "Highest final valid sacreBLEU: r1_drop0.1 (36.50)" in text
    assert "no test set" in text and text == capsys.readouterr().out


def test_tuning_without_runs_is_an_error(tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    assert main([str(tmp_path / "empty"), f"out={tmp_path}", "name=t", "kind=tuning"]) == 2
    assert "no completed runs" in capsys.readouterr().err
