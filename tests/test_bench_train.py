"""scripts/bench/bench_train.py's WMT-like workload (issue 43 §4) end to end on a synthetic corpus laid out as
../shared/data is (never read here), with a tiny model on the CPU; and the pieces of
scripts/peers/onmt_train.py that need no OpenNMT-py (its text export, config and log parsing)."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import numpy as np
import yaml

from relmt.data.tokenizer import EOS_ID
from tests.test_scripts import ROOT, run_script

WORDS = ("the house of parliament voted on a new report about energy and water in europe while "
         "die kommission hat den bericht über neue energie und wasser heute endlich angenommen").split()


def shared_corpus(root: Path) -> Path:
    """europarl20k_ende/train.{en,de} and wmt14_ende/test.{en,de} of random sentences, 2 to 30 words."""
    rng = np.random.default_rng(0)
    for folder, split, n in (("europarl20k_ende", "train", 240), ("wmt14_ende", "test", 40)):
        (root / folder).mkdir(parents=True)
        lengths = rng.integers(2, 31, n)
        for lang in ("en", "de"):
            lines = [" ".join(rng.choice(WORDS, int(k))) for k in lengths]
            (root / folder / f"{split}.{lang}").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return root


def test_wmt_like_workload_prepares_once_and_the_benchmark_runs(tmp_path):
    shared, data = shared_corpus(tmp_path / "shared"), tmp_path / "wmt_like"
    common = ["--shared-data", str(shared), "--data", str(data), "--vocab-size", "150", "--cache-dir",
              str(tmp_path / "cache")]
    run_script("bench_train.py", "--prepare-only", *common)
    meta = json.loads((data / "meta.json").read_text())
    assert meta["pairs_read"] == 280 and meta["pairs"] <= 280 and meta["vocab_size"] <= 150
    src, offsets = np.load(data / "src.npy"), np.load(data / "src_offsets.npy")
    assert src.dtype == np.int16 and offsets.dtype == np.int32 and len(offsets) == meta["pairs"] + 1
    assert (src[offsets[1:] - 1] == EOS_ID).all()  # every source ends in EOS, as the trainer's do
    stamp = (data / "meta.json").stat().st_mtime_ns
    out, md = tmp_path / "t.json", tmp_path / "t.md"
    run_script("bench_train.py", *common, "--sizes", "tiny", "--steps", "2", "--warmup", "1", "--device", "cpu",
               "--tgt-tokens", "300", "--peak-n", "64", "--pad-to-multiple", "8", "--profile-steps", "1",
               "--out", str(out), "--md", str(md))
    assert (data / "meta.json").stat().st_mtime_ns == stamp  # the prepared data is reused, not rebuilt
    payload = json.loads(out.read_text())
    rows = payload["rows"]
    assert [r["positions"] for r in rows] == ["abs", "rel", "both", "rope", "alibi", "t5"]
    for r in rows:
        assert r["system"] == "relmt" and r["size"] == "tiny" and r["steps"] == 2
        assert r["tgt_tokens_per_s"] > 0 and 0 < r["mfu"] and r["mfu_abs_flops"] > 0 and r["peak_mib"] is None
        top = r["top_ops"]  # --profile-steps: where the step goes, most first
        assert 0 < len(top) <= 12 and top[0]["ms_per_step"] >= top[-1]["ms_per_step"] > 0
        assert sum(o["share"] for o in top) <= 1 + 1e-9
    assert rows[0]["over_abs_step_time"] == 1.0 and rows[0]["mfu_abs_flops"] == rows[0]["mfu"]
    # every token goes through one stack's linear maps, forward and backward (6 FLOPs a weight): a floor the
    # count missed while oneDNN's products (CPU float32 training) counted as 0
    from relmt.config import compose

    tiny = compose(["model=tiny"]).model
    per_layer = 4 * tiny.d_model ** 2 + 2 * tiny.d_model * tiny.d_ff
    assert rows[0]["flops_per_token"] >= 6 * per_layer * min(tiny.encoder_layers, tiny.decoder_layers)
    assert payload["settings"]["precision"] == "auto" and payload["vocab_size"] == meta["vocab_size"]
    assert payload["mean_tokens_per_batch"]["tgt"] > 0 and "WMT-like" in payload["workload"]
    text = md.read_text()
    assert "step time / abs" in text and "MFU at abs's FLOPs" in text and str(shared) in text
    assert "## Where each step goes" in text and "### tiny rel" in text
    run_script("bench_train.py", *common, "--sizes", "tiny", "--positions", "abs", "rel", "--steps", "1", "--warmup",
               "1", "--device", "cpu", "--tgt-tokens", "300", "--peak-n", "64", "--route", "chunked", "--out", str(out))
    assert [r.get("route") for r in json.loads(out.read_text())["rows"]] == ["chunked", "chunked"]


def load_onmt_train():
    spec = importlib.util.spec_from_file_location("onmt_train", ROOT / "scripts/peers/onmt_train.py")
    module = sys.modules["onmt_train"] = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_onmt_gets_the_same_pieces_sizes_and_budget(tmp_path):
    onmt = load_onmt_train()
    shared, data = shared_corpus(tmp_path / "shared"), tmp_path / "wmt_like"
    run_script("bench_train.py", "--prepare-only", "--shared-data", str(shared), "--data", str(data),
               "--vocab-size", "150", "--cache-dir", str(tmp_path / "cache"))
    text = onmt.write_text(data, tmp_path / "text")
    src = (text / "train.src").read_text(encoding="utf-8").splitlines()
    offsets = np.load(data / "src_offsets.npy")
    assert len(src) == len(offsets) - 1
    assert [len(line.split()) for line in src] == list(np.diff(offsets) - 1)  # all but the EOS
    vocab = [line.split("\t")[0] for line in (text / "vocab.shared").read_text(encoding="utf-8").splitlines()]
    assert len(vocab) == json.loads((data / "meta.json").read_text())["vocab_size"] - 4
    assert not {"<pad>", "<s>", "</s>", "<unk>"} & set(vocab) and set(" ".join(src).split()) <= set(vocab)
    cfg = yaml.safe_load(onmt.config(text, tmp_path / "run", "big", "rel", 16, 26000, 40, 10, "cuda", 2, len(src)))
    assert (cfg["hidden_size"], cfg["heads"], cfg["transformer_ff"], cfg["enc_layers"]) == (1024, 16, 4096, 6)
    assert cfg["max_relative_positions"] == 16 and cfg["position_encoding"] is False
    assert cfg["batch_size"] == 26000 and cfg["batch_type"] == "tokens" and cfg["model_dtype"] == "fp16"
    assert cfg["bucket_size"] == len(src) and cfg["gpu_ranks"] == [0]
    assert cfg["train_steps"] > 40 and cfg["save_checkpoint_steps"] > 40
    cfg = yaml.safe_load(onmt.config(text, tmp_path / "run", "base", "abs", 16, 26000, 40, 10, "cpu", 0, len(src)))
    assert cfg["position_encoding"] is True and cfg["max_relative_positions"] == 0 and cfg["gpu_ranks"] == []


def test_onmt_throughput_is_read_from_its_log_lines(tmp_path):
    onmt = load_onmt_train()
    log = tmp_path / "train.log"
    line = ("[2026-11-26 10:00:{:02d},000 INFO] Step {}/ 1040; acc: 5.1; ppl: 900.1; xent: 6.8; lr: 0.00001; "
            "sents:    8000; bsz: 24000/25000/800; 90000/95000 tok/s;     12 sec;")
    log.write_text("\n".join(["[2026-11-26 10:00:00,000 INFO] Starting training on GPU: [0]"]
                             + [line.format(2 * s // 10, s) for s in (10, 20, 30, 40)]) + "\n")
    result = onmt.throughput(log, 20, 40, 10)
    # updates 21..40: two log lines of 10 updates each, 25,000 target tokens per update, in 4 seconds
    assert result["tgt_tokens_per_s"] == 2 * 10 * 25000 / 4 and result["steps"] == 20
    assert result["src_tgt_tokens_per_s"] == 2 * 10 * 49000 / 4 and result["step_ms"] == 200


def test_gpu_report_fills_issue_43s_goal_table(tmp_path):
    """scripts/gpu/gpu_report.py on files shaped like scripts/gpu/gpu_checks.sh's (fabricated figures)."""
    d = tmp_path / "gpu43"
    d.mkdir()
    (d / "tests.txt").write_text("tests/test_cuda.py::test_a PASSED [ 50%]\ntests/test_cuda.py::test_b FAILED [100%]\n"
                                 "[gw1] [ 99%] FAILED tests/test_x.py::test_c[a long-limit]\n"
                                 "\n--- why tests/test_x.py::test_c[a long-limit] failed (setup):\n"
                                 "E   OSError: no disk\n---\n"
                                 "\n--- why tests/test_cuda.py::test_b failed (call):\n"
                                 "tests/test_cuda.py:9: in test_b\n    assert x\n"
                                 "E   AssertionError: the flex kernel refused bf16\n---\n"
                                 "=== 1 failed, 1 passed in 3.0s ===\n")
    hw = {"gpu": "NVIDIA H100 80GB HBM3", "date": "2026-12-01 10:00 UTC", "torch": "2.11.0+cu130", "git": "abc1234"}
    attn = [{"case": "abs", "n": 1024, "peak_over_abs": 1.0}, {"case": "rel:flex", "n": 128, "peak_over_abs": 3.0},
            {"case": "rel:reference", "n": 1024, "peak_over_abs": 7.4},
            {"case": "rel:flex", "n": 1024, "peak_over_abs": 1.2}]
    (d / "attn.json").write_text(json.dumps({"hardware": hw, "rows": attn}))
    train = [{"system": "relmt", "size": s, "positions": p, "tgt_tokens_per_s": t, "mfu": m, "over_abs_step_time": r}
             for s, p, t, m, r in (("base", "abs", 3e5, 0.31, 1.0), ("base", "rel", 2.8e5, 0.3, 1.07),
                                   ("big", "abs", 1.5e5, 0.41, 1.0), ("big", "rel", 1.3e5, 0.35, 1.15))]
    train += [{"system": "OpenNMT-py 3.5.1", "size": "base", "positions": p, "tgt_tokens_per_s": t}
              for p, t in (("abs", 2e5), ("rel", 1e5))]
    (d / "train43.json").write_text(json.dumps({"hardware": hw, "rows": train}))
    (d / "train43.md").write_text("# Training throughput (cuda)\n\nWorkload: WMT-like.\n")
    flex = [{"system": "relmt", "size": "base", "positions": p, "route": "flex", "over_abs_step_time": r}
            for p, r in (("abs", 1.0), ("rel", 1.04))]
    (d / "train43f.json").write_text(json.dumps({"hardware": hw, "rows": flex}))
    out = tmp_path / "gpu_issue43"
    run_script("gpu_report.py", "--dir", str(d), "--out", str(out))
    goals = [(g["measured"], g["met"]) for g in json.loads(out.with_suffix(".json").read_text())["goals"]]
    assert goals[:8] == [("tests 2", "no"), ("rel:reference 7.40, rel:flex 1.20", "no"),
                         ("base rel 1.07, big rel 1.15", "no"), ("base rel 1.04", "yes"),
                         ("big abs 41.0%, big rel 35.0%", "no"),
                         ("base abs 31.0%", "yes"), ("base 2.80", "yes"), ("base 1.50", "yes")]
    md = out.with_suffix(".md").read_text()
    assert "NVIDIA H100 80GB HBM3" in md and "Workload: WMT-like." in md
    assert "`tests/test_cuda.py::test_b`: AssertionError: the flex kernel refused bf16" in md  # pytest_instant's
    assert "`tests/test_x.py::test_c[a long-limit]`: OSError: no disk" in md  # a parameter with a space
    # a call cut off before n = 1024 neither meets nor misses the memory goal, and says so
    (d / "attn.json").write_text(json.dumps({"hardware": hw, "rows": [r for r in attn if r["n"] == 128]}))
    run_script("gpu_report.py", "--dir", str(d), "--out", str(out))
    memory = json.loads(out.with_suffix(".json").read_text())["goals"][1]
    assert memory["met"] == "" and "reached only n = 128" in memory["what"] and memory["measured"] == "rel:flex 3"


def test_gpu_checks_script_parses():
    import subprocess

    subprocess.run(["bash", "-n", str(ROOT / "scripts/gpu/gpu_checks.sh")], check=True)
    subprocess.run(["bash", "-n", str(ROOT / "scripts/gpu/gpu_wheels.sh")], check=True)


def test_the_gpu_calls_plugin_prints_why_a_test_failed_as_it_fails(tmp_path):
    """scripts/gpu/pytest_instant.py: a failure's reason comes right after its line, before the next test runs
    (a call cut off by its time box never reaches pytest's summary)."""
    import os
    import subprocess

    (tmp_path / "test_two.py").write_text("def test_fails():\n    assert 2 + 2 == 5, 'arithmetic'\n\n"
                                          "def test_passes():\n    print('second test ran')\n")
    env = {**os.environ, "PYTHONPATH": str(ROOT / "scripts/gpu")}
    done = subprocess.run([sys.executable, "-m", "pytest", "-v", "-s", "-p", "pytest_instant", "--tb=short",
                           "-p", "no:cacheprovider", str(tmp_path / "test_two.py")],
                          capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120)
    out = done.stdout
    assert done.returncode == 1 and "--- why test_two.py::test_fails failed (call):" in out
    assert out.index("AssertionError: arithmetic") < out.index("second test ran")
    spec = importlib.util.spec_from_file_location("gpu_report", ROOT / "scripts/gpu/gpu_report.py")
    report = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(report)
    assert report.why_failed(out) == {"test_two.py::test_fails": "AssertionError: arithmetic"}  # what the page shows


def test_a_size_that_runs_out_of_gpu_memory_is_measured_again_on_smaller_batches(monkeypatch):
    """One shot at a GPU: out of memory at the paper's batch, bench_train.py measures that size again at two
    thirds the budget (and says so in its rows), or names the error, and goes on with the next part."""
    import argparse

    import torch

    from tests.scripts_import import load_script

    bench = load_script("bench_train")
    budgets = []

    def measure(size, args, vocab, batches, *rest):
        budgets.append(len(batches))
        if len(budgets) == 1 or size == "big":
            raise torch.cuda.OutOfMemoryError("CUDA out of memory")
        return [{"system": "relmt", "size": size, "positions": "abs"}]

    monkeypatch.setattr(bench, "measure_size", measure)
    monkeypatch.setattr(bench, "make_batches",
                        lambda ids, budget, args, device, batch_by="source": (["batch"] * budget, None))
    args = argparse.Namespace(max_padded_tokens=9, positions=["abs", "rel"])
    rows = bench.measure_fitting("base", args, None, 10, ["batch"] * 9, torch.device("cpu"), None, 1.0, False)
    assert budgets == [9, 6] and rows == [{"system": "relmt", "size": "base", "positions": "abs",
                                           "max_padded_tokens": 6, "note": "out of memory at 9"}]
    (row,) = bench.measure_fitting("big", args, None, 10, ["batch"] * 9, torch.device("cpu"), None, 1.0, False)
    assert row["error"] == "CUDA out of memory at 9 and at 6 padded tokens a batch" and row["positions"] == "abs rel"


def test_mfu_counts_a_cuda_rel_steps_float32_label_sums():
    """bench_train's FLOP count (relmt.bench.flop_counter) on a bf16 rel training step on "CUDA" (the device lane):
    the label sums' bmm with a float32 output (relmt/model/labels.py) is counted, where torch's own formula raised
    (its rehearsal found this before a GPU call did)."""
    import torch

    from relmt.bench import flop_counter
    from relmt.config import ModelConfig, PosKind
    from relmt.model.transformer import build_model
    from tests.fake_cuda import fake_cuda

    cfg = ModelConfig(d_model=16, n_heads=2, d_ff=32, encoder_layers=1, decoder_layers=1, positions=PosKind.rel,
                      max_relative_position=2)
    src = torch.tensor([[5, 6, 7, 8, 9, 2]])
    with fake_cuda():
        net = build_model(cfg, 20, 0).cuda()
        with flop_counter() as counter, torch.autocast("cuda", dtype=torch.bfloat16):
            net(src.cuda(), src.cuda()).float().sum().backward()
    bmm = counter.get_flop_counts()["Global"].get(torch.ops.aten.bmm, 0)
    assert bmm > 0 and counter.get_total_flops() > bmm
