"""Training pieces and the loop, in-process on tiny settings (CPU)."""

from __future__ import annotations

import json
import logging
import math
import os
import signal
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from relmt import checkpoint, runtime
from relmt.config import ModelConfig, TrainConfig, compose
from relmt.data.batching import Batch
from relmt.errors import UserError
from relmt.model import linear
from relmt.model.transformer import build_model
from relmt.train import distributed
from relmt.train import loop as loop_module
from relmt.train import step as step_module
from relmt.train.loss import label_smoothed_nll
from relmt.train.optim import inverse_sqrt_lr, noam_lr

# --- schedules and loss ---------------------------------------------------------------------------

def test_noam_schedule_by_hand():
    # Vaswani §5.3 with d_model 512, warmup 4000: at step 4000 both branches meet.
    assert noam_lr(4000, 512, 4000) == pytest.approx(512 ** -0.5 * 4000 ** -0.5)
    assert noam_lr(100, 512, 4000) == pytest.approx(512 ** -0.5 * 100 * 4000 ** -1.5)
    assert noam_lr(16000, 512, 4000, scale=2.0) == pytest.approx(2 * 512 ** -0.5 / 126.49110640673517)
    assert noam_lr(0, 512, 4000) == noam_lr(1, 512, 4000)  # steps count from 1


def test_inverse_sqrt_schedule_by_hand():
    assert inverse_sqrt_lr(50, 1e-3, 100) == pytest.approx(5e-4)
    assert inverse_sqrt_lr(100, 1e-3, 100) == pytest.approx(1e-3)
    assert inverse_sqrt_lr(400, 1e-3, 100) == pytest.approx(5e-4)


@pytest.mark.parametrize("eps", [0.0, 0.1, 0.3])
def test_label_smoothed_loss_matches_torch(eps):
    torch.manual_seed(0)
    logits = torch.randn(3, 5, 11, dtype=torch.float64)
    target = torch.randint(1, 11, (3, 5))
    target[1, 3:] = 0  # padding
    loss, nll = label_smoothed_nll(logits, target, eps)
    flat_logits, flat_target = logits.reshape(-1, 11), target.reshape(-1)
    ref = F.cross_entropy(flat_logits, flat_target, ignore_index=0, reduction="sum", label_smoothing=eps)
    ref_nll = F.cross_entropy(flat_logits, flat_target, ignore_index=0, reduction="sum")
    torch.testing.assert_close(loss, ref)
    torch.testing.assert_close(nll, ref_nll)


@pytest.mark.parametrize("eps", [0.0, 0.1])
def test_label_smoothed_loss_gradient_matches_autograd_reference(eps):
    """The written-out backward against autograd through the naive float64 formula, for weighted
    loss and nll outputs (both can carry gradient), padding rows included."""
    torch.manual_seed(1)
    logits = torch.randn(4, 6, 13, dtype=torch.float64, requires_grad=True)
    target = torch.randint(1, 13, (4, 6))
    target[0, 2:] = 0
    target[3, 5] = 0

    def naive(x):
        lp = torch.log_softmax(x, dim=-1)
        keep = target != 0
        nll = -lp.gather(-1, target.unsqueeze(-1)).squeeze(-1)[keep].sum()
        return (1 - eps) * nll - eps * lp.mean(-1)[keep].sum(), nll

    loss, nll = label_smoothed_nll(logits, target, eps)
    grad = torch.autograd.grad(0.7 * loss + 0.3 * nll, logits)[0]
    ref_loss, ref_nll = naive(logits)
    ref = torch.autograd.grad(0.7 * ref_loss + 0.3 * ref_nll, logits)[0]
    torch.testing.assert_close(grad, ref, rtol=1e-12, atol=1e-12)
    assert grad[0, 2:].abs().max() == 0  # padding rows get no gradient
    assert torch.autograd.gradcheck(lambda x: label_smoothed_nll(x, target, eps), (logits,))


def test_label_smoothed_loss_low_precision_logits_get_float32_math_and_own_dtype_grad():
    logits = torch.randn(2, 3, 7).to(torch.bfloat16).requires_grad_()
    target = torch.tensor([[1, 2, 3], [4, 0, 0]])
    loss, nll = label_smoothed_nll(logits, target, 0.1)
    assert loss.dtype == torch.float32
    loss.backward()
    assert logits.grad.dtype == torch.bfloat16
    ref = F.cross_entropy(logits.float().reshape(-1, 7), target.reshape(-1), ignore_index=0, reduction="sum",
                          label_smoothing=0.1)
    torch.testing.assert_close(loss, ref)


# --- checkpoints -------------------------------------------------------------------------------------

def fake_payload(value: float, step: int = 1) -> dict:
    return {"format": checkpoint.CHECKPOINT_FORMAT, "config": {"model": {}}, "spm": {}, "step": step,
            "model": {"w": torch.full((2, 3), value), "n": torch.tensor([step])}}


def test_save_writes_all_names_and_loads_back(tmp_path):
    checkpoint.save(fake_payload(1.5), tmp_path, ["step_1.pt", "last.pt", "best.pt"])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["best.pt", "last.pt", "step_1.pt"]
    for name in ("step_1.pt", "last.pt", "best.pt"):
        assert torch.equal(checkpoint.load(tmp_path / name)["model"]["w"], torch.full((2, 3), 1.5))


def test_prune_keeps_the_newest(tmp_path):
    for step in (2, 10, 4, 8):
        checkpoint.save(fake_payload(0.0, step), tmp_path, [f"step_{step}.pt"])
    checkpoint.prune(tmp_path, keep=2)
    assert [p.name for p in checkpoint.step_files(tmp_path)] == ["step_8.pt", "step_10.pt"]


def test_corrupt_and_foreign_checkpoints_give_clear_errors(tmp_path):
    checkpoint.save(fake_payload(1.0), tmp_path, ["good.pt"])
    data = (tmp_path / "good.pt").read_bytes()
    (tmp_path / "truncated.pt").write_bytes(data[: len(data) // 2])
    with pytest.raises(UserError, match="truncated.pt: not a readable checkpoint"):
        checkpoint.load(tmp_path / "truncated.pt")
    (tmp_path / "junk.pt").write_bytes(b"this is not a checkpoint")
    with pytest.raises(UserError, match="junk.pt: not a readable checkpoint"):
        checkpoint.load(tmp_path / "junk.pt")
    torch.save({"state_dict": {}}, tmp_path / "foreign.pt")
    with pytest.raises(UserError, match="foreign.pt: not a relmt checkpoint"):
        checkpoint.load(tmp_path / "foreign.pt")
    with pytest.raises(UserError, match="missing.pt: no such checkpoint"):
        checkpoint.load(tmp_path / "missing.pt")


def test_averaging_identical_checkpoints_gives_the_same_weights(tmp_path):
    torch.manual_seed(0)
    w = torch.randn(4, 4)
    for i in range(3):
        payload = fake_payload(0.0, i)
        payload["model"]["w"] = w.clone()
        checkpoint.save(payload, tmp_path, [f"step_{i}.pt"])
    avg = checkpoint.average(checkpoint.step_files(tmp_path))
    assert torch.equal(avg["model"]["w"], w)


def test_averaging_takes_the_mean(tmp_path):
    for i, value in enumerate((1.0, 2.0, 6.0)):
        checkpoint.save(fake_payload(value, i), tmp_path, [f"step_{i}.pt"])
    avg = checkpoint.average(checkpoint.step_files(tmp_path))
    torch.testing.assert_close(avg["model"]["w"], torch.full((2, 3), 3.0))
    assert avg["model"]["n"].tolist() == [2]  # integer buffers come from the last checkpoint


def test_average_cli(tmp_path, capsys):
    from relmt.cli.average import _average
    from relmt.cli.common import guarded

    for i, value in enumerate((1.0, 3.0, 5.0)):
        checkpoint.save(fake_payload(value, i), tmp_path, [f"step_{i}.pt"])
    assert guarded("relmt-average", _average, [f"dir={tmp_path}", "last=2", f"output={tmp_path}/avg.pt"]) == 0
    torch.testing.assert_close(checkpoint.load(tmp_path / "avg.pt")["model"]["w"], torch.full((2, 3), 4.0))
    assert guarded("relmt-average", _average, [f"dir={tmp_path}", "last=9", f"output={tmp_path}/x.pt"]) == 2
    assert "holds 3 step checkpoints" in capsys.readouterr().err


# --- the loop ---------------------------------------------------------------------------------------

def tiny_config(tmp_path: Path, run: str, *overrides: str):
    cfg = compose(["model=tiny", "train=debug", f"data.cache_dir={tmp_path / 'cache'}", "data.toy.n_train=400",
                   "data.toy.n_valid=30", "data.toy.n_test=20", "data.toy.n_test_long=20", *overrides])
    cfg.out_dir = str(tmp_path / run)
    return cfg


def train_records(run_dir: Path, tag: str = "train") -> dict[int, dict]:
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return {r["step"]: r for r in map(json.loads, lines) if r["tag"] == tag}


def test_train_writes_every_artifact(tmp_path, monkeypatch):
    cfg = tiny_config(tmp_path, "run")
    for var in linear.CACHES:  # unset for the run, restored after the test
        monkeypatch.setenv(var, "")
        monkeypatch.delenv(var)
    metrics = loop_module.train(cfg)
    assert {var: os.environ.get(var) for var in linear.CACHES} == dict.fromkeys(linear.CACHES, "1")  # bounded
    run = tmp_path / "run"
    assert metrics["status"] == "completed" and metrics["steps"] == 6
    for name in ("metrics.json", "metrics.jsonl", "tb", "checkpoints/last.pt", "checkpoints/best.pt",
                 "checkpoints/step_6.pt", "translations/test.tgt", "translations/test_long.tgt"):
        assert (run / name).exists(), name
    assert not (run / "checkpoints/step_3.pt").exists() or cfg.train.keep_last >= 2
    saved = json.loads((run / "metrics.json").read_text())
    for key in ("final_valid", "best", "steps", "wall_seconds", "tokens_per_s", "params", "test"):
        assert key in saved
    assert saved["test_seconds"] > 0  # the final test decoding's time, which wall_seconds leaves out
    from relmt.host import cpu_model

    assert saved["host"]["cpu"] == cpu_model()  # what tokens_per_s was measured on
    assert saved["test_checkpoint_rule"] == "best" and saved["test_checkpoint"].endswith("best.pt")
    assert set(saved["test"]) == {"test", "test_long"}
    assert "BLEU" in saved["test"]["test"]["signature"] or "tok:13a" in saved["test"]["test"]["signature"]
    ck = checkpoint.load(run / "checkpoints/last.pt")
    for key in ("model", "optim", "scaler", "rng", "position", "config", "spm", "state"):
        assert key in ck
    assert ck["spm"]["sha256"] and ck["spm"]["model"][:4]  # the vocabulary travels with the weights
    assert ck["config"]["model"]["positions"] == "rel"
    tags = {r["tag"] for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines())}
    assert tags == {"train", "valid"}


def test_without_valid_bleu_best_pt_holds_the_lowest_validation_loss(tmp_path):
    """best_metric=bleu falls back to the validation loss when BLEU is not measured, and then the
    lowest loss is the best."""
    run = tmp_path / "run"
    metrics = loop_module.train(tiny_config(tmp_path, "run", "train.valid_bleu=false", "train.eval_every=1"))
    losses = {step: r["loss"] for step, r in train_records(run, "valid").items()}
    assert sorted(losses) == list(range(1, 7))
    best_step = min(losses, key=losses.get)
    assert metrics["best"] == {"metric": "loss", "value": losses[best_step], "step": best_step}
    assert checkpoint.load(run / "checkpoints/best.pt")["step"] == best_step


@pytest.mark.parametrize("positions", ["rel", "t5", "rope"])
def test_resumed_run_equals_uninterrupted(tmp_path, positions):
    """Same loss at every step and the same final weights, with dropout on (RNG restored); t5's stack-wide
    table is saved and restored with the rest."""
    mode = f"model.positions={positions}"
    full = tiny_config(tmp_path, "full", "train.max_steps=8", "train.save_every=4", "train.eval_every=4", mode)
    loop_module.train(full)
    first = tiny_config(tmp_path, "split", "train.max_steps=4", "train.save_every=4", "train.eval_every=4", mode)
    first_wall = loop_module.train(first)["wall_seconds"]
    second = tiny_config(tmp_path, "split", "train.max_steps=8", "train.save_every=4", "train.eval_every=4",
                         "train.resume=true", mode)
    second_wall = loop_module.train(second)["wall_seconds"]
    # wall time sums the sessions: the first one's, up to its checkpoint, carries into the second's
    saved = checkpoint.load(tmp_path / "split/checkpoints/step_4.pt")["state"]["wall_seconds"]
    assert 0 < saved <= first_wall and second_wall > saved
    a, b = train_records(tmp_path / "full"), train_records(tmp_path / "split")
    assert sorted(a) == sorted(b) == list(range(1, 9))
    for step in range(1, 9):
        assert a[step]["loss"] == b[step]["loss"], step
    wa = checkpoint.load(tmp_path / "full/checkpoints/last.pt")["model"]
    wb = checkpoint.load(tmp_path / "split/checkpoints/last.pt")["model"]
    for key in wa:
        assert torch.equal(wa[key], wb[key]), key


def test_a_run_directory_is_not_overwritten(tmp_path):
    loop_module.train(tiny_config(tmp_path, "run"))
    with pytest.raises(UserError, match="already holds a run.*train.resume=true"):
        loop_module.train(tiny_config(tmp_path, "run"))


def test_resume_needs_a_compatible_checkpoint(tmp_path, caplog):
    # a requeued job stopped before its first checkpoint (or never started) starts from scratch, and says so
    with caplog.at_level(logging.INFO):
        assert loop_module.train(tiny_config(tmp_path, "nothing", "train.resume=true"))["status"] == "completed"
    assert "no checkpoint in" in caplog.text and "so the run starts from scratch" in caplog.text
    loop_module.train(tiny_config(tmp_path, "run"))
    with pytest.raises(UserError, match=r"cannot resume with model.d_model=48 \(saved: 32\)"):
        loop_module.train(tiny_config(tmp_path, "run", "train.resume=true", "model.d_model=48"))
    for path in (tmp_path / "run/checkpoints").glob("*.pt"):
        path.write_bytes(b"garbage")
    with pytest.raises(UserError, match="(?s)not a readable checkpoint.*no readable step_N.pt"):
        loop_module.train(tiny_config(tmp_path, "run", "train.resume=true"))


def no_data(monkeypatch) -> None:
    """Fail the test if the data is prepared (errors should come before that work)."""
    def prepare(cfg):
        raise AssertionError("the data was prepared before the error")

    monkeypatch.setattr(loop_module, "prepare", prepare)


def test_resume_refuses_settings_that_change_the_batch_order(tmp_path, monkeypatch):
    loop_module.train(tiny_config(tmp_path, "run", "train.valid_bleu=false"))
    no_data(monkeypatch)
    for override, saved in [("seed=2", "1"), ("train.max_padded_tokens=256", "512"), ("train.update_freq=2", "1"),
                            ("train.max_sentences=8", "0"), ("data.toy.n_train=300", "400")]:
        key, value = override.split("=")
        with pytest.raises(UserError, match=rf"last.pt: cannot resume with {key}={value} \(saved: {saved}\)"):
            loop_module.train(tiny_config(tmp_path, "run", "train.resume=true", "train.max_steps=8", override))


def test_a_checkpoint_saved_before_the_train_renames_resumes_under_the_new_names(tmp_path):
    """Checkpoints saved with train.lr and train.max_tokens (before issue 13) resume: lr becomes the
    field its schedule reads (debug: inverse_sqrt, so peak_lr), max_tokens max_padded_tokens, and the
    batch-order check compares the old value under its new name."""
    run = tmp_path / "run"
    loop_module.train(tiny_config(tmp_path, "run", "train.valid_bleu=false", "train.max_steps=3"))
    ck = checkpoint.load(run / "checkpoints/last.pt")
    old = ck["config"]["train"]
    old["lr"], old["max_tokens"] = old.pop("peak_lr"), old.pop("max_padded_tokens")
    del old["noam_scale"]
    checkpoint.save(ck, run / "checkpoints", ["last.pt"])
    with pytest.raises(UserError, match=r"cannot resume with train.max_padded_tokens=256 \(saved: 512\)"):
        loop_module.train(tiny_config(tmp_path, "run", "train.valid_bleu=false", "train.max_steps=6",
                                      "train.resume=true", "train.max_padded_tokens=256"))
    metrics = loop_module.train(tiny_config(tmp_path, "run", "train.valid_bleu=false", "train.max_steps=6",
                                            "train.resume=true"))
    assert metrics["status"] == "completed" and metrics["steps"] == 6
    saved = checkpoint.load(run / "checkpoints/last.pt")["config"]["train"]
    assert "lr" not in saved and saved["peak_lr"] == 0.002 and saved["max_padded_tokens"] == 512


def test_resume_falls_back_to_the_newest_readable_step_checkpoint(tmp_path, caplog):
    run = tmp_path / "run"
    loop_module.train(tiny_config(tmp_path, "run", "train.valid_bleu=false", "train.max_steps=6"))
    # last.pt is a hard link to step_6.pt, so the flipped bytes damage both; step_3.pt is intact.
    last = run / "checkpoints/last.pt"
    data = bytearray(last.read_bytes())
    middle = len(data) // 2
    data[middle: middle + 64] = bytes(b ^ 0xFF for b in data[middle: middle + 64])
    last.write_bytes(bytes(data))
    with caplog.at_level("WARNING", logger="relmt.train.resume"):
        metrics = loop_module.train(tiny_config(tmp_path, "run", "train.valid_bleu=false", "train.max_steps=8",
                                                "train.resume=true"))
    assert f"resuming from {run / 'checkpoints/step_3.pt'} instead" in caplog.text
    assert metrics["status"] == "completed" and metrics["steps"] == 8
    steps = [r["step"] for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines())
             if r["tag"] == "train"]
    assert steps == list(range(1, 9))  # steps 4-6 of the first run were dropped, then logged again


def test_resume_trims_the_metrics_log_and_purges_tensorboard(tmp_path, monkeypatch):
    """After a kill -9 the log holds steps after the last save (here 5, 6 and a cut-off line)."""
    run = tmp_path / "run"
    common = ("train.valid_bleu=false", "train.save_every=4", "train.eval_every=4")
    loop_module.train(tiny_config(tmp_path, "run", "train.max_steps=4", *common))
    with (run / "metrics.jsonl").open("a") as f:
        f.write('{"step": 5, "tag": "train", "loss": 1.0}\n{"step": 6, "tag": "train", "loss": 1.0}\n{"step": 7, "ta')
    purge_steps = []

    class Writer(loop_module.SummaryWriter):
        def __init__(self, logdir, purge_step=None):
            purge_steps.append(purge_step)
            super().__init__(logdir, purge_step=purge_step)

    monkeypatch.setattr(loop_module, "SummaryWriter", Writer)
    loop_module.train(tiny_config(tmp_path, "run", "train.max_steps=6", "train.resume=true", *common))
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records if r["tag"] == "train"] == list(range(1, 7))
    assert [r["step"] for r in records if r["tag"] == "valid"] == [4, 6]
    assert purge_steps == [5]  # TensorBoard drops the events of steps >= 5 from the earlier run


def test_cuda_without_cuda_fails_before_the_data_is_prepared(tmp_path, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    no_data(monkeypatch)
    with pytest.raises(UserError, match="train.device=cuda: .*use cpu or auto"):
        loop_module.train(tiny_config(tmp_path, "run", "train.device=cuda"))
    # relmt-translate resolves its device=... the same way
    with pytest.raises(UserError, match="^device=cuda:1: "):
        runtime.resolve_device("cuda:1")
    with pytest.raises(UserError, match="device=gpu: not a device"):
        runtime.resolve_device("gpu")


def test_fp16_on_cpu_is_refused_before_the_data_is_prepared(tmp_path, monkeypatch):
    no_data(monkeypatch)
    with pytest.raises(UserError, match="train.precision=fp16 needs a CUDA device"):
        loop_module.train(tiny_config(tmp_path, "run", "train.device=cpu", "train.precision=fp16"))


def test_the_ddp_timeout_comes_from_the_config(tmp_path, monkeypatch):
    calls = []
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("LOCAL_RANK", "1")
    monkeypatch.setattr(distributed.dist, "is_initialized", lambda: False)
    monkeypatch.setattr(distributed.dist, "init_process_group", lambda backend, **kw: calls.append((backend, kw)))
    d = distributed.setup("cpu", timeout_minutes=90)
    assert (d.rank, d.world_size) == (1, 2)
    assert calls == [("gloo", {"timeout": timedelta(minutes=90)})]

    seen = []

    def setup(device, timeout_minutes):
        seen.append(timeout_minutes)
        raise UserError("stop here")

    monkeypatch.setattr(distributed, "setup", setup)
    with pytest.raises(UserError, match="stop here"):
        loop_module.train(tiny_config(tmp_path, "run", "train.dist_timeout_minutes=120"))
    assert seen == [120]


def nan_at(steps: set[int], monkeypatch):
    """Make the loss NaN on the given (1-based) updates."""
    real = step_module.label_smoothed_nll
    calls = {"n": 0}

    def fake(logits, target, eps):
        calls["n"] += 1
        loss, nll = real(logits, target, eps)
        if calls["n"] in steps:
            return loss * math.nan, nll
        return loss, nll

    monkeypatch.setattr(step_module, "label_smoothed_nll", fake)


def test_a_nan_loss_skips_the_update_and_is_counted(tmp_path, monkeypatch):
    nan_at({3}, monkeypatch)
    metrics = loop_module.train(tiny_config(tmp_path, "run", "train.valid_bleu=false"))
    assert metrics["status"] == "completed" and metrics["skipped_updates"] == 1
    ck = checkpoint.load(tmp_path / "run/checkpoints/last.pt")
    assert all(torch.isfinite(v).all() for v in ck["model"].values() if v.is_floating_point())


def test_too_many_nan_losses_in_a_row_stop_with_a_clear_error(tmp_path, monkeypatch):
    nan_at({2, 3, 4}, monkeypatch)
    with pytest.raises(UserError, match="NaN/inf for 3 updates in a row.*lower train.peak_lr"):
        loop_module.train(tiny_config(tmp_path, "run", "train.max_bad_steps=3", "train.valid_bleu=false"))


def test_count_skipped_counts_the_bad_updates_in_a_row():
    tcfg, last = TrainConfig(max_bad_steps=2), Path("run/checkpoints/last.pt")
    assert step_module.count_skipped(1.0, 0.5, None, 1, 7, 1e-3, tcfg, last) == (0, False)  # a good one resets
    assert step_module.count_skipped(math.nan, math.nan, None, 0, 7, 1e-3, tcfg, last) == (1, True)
    # fp16: an overflow with a healthy loss scale is skipped, but not counted toward max_bad_steps
    assert step_module.count_skipped(1.0, math.inf, 2.0 ** 10, 1, 7, 1e-3, tcfg, last) == (1, True)
    for fp16_scale in (None, step_module.MIN_LOSS_SCALE / 2):  # fp32, or a collapsed fp16 scale
        with pytest.raises(UserError, match=r"NaN/inf for 2 updates in a row \(step 7.*lower train.noam_scale"):
            step_module.count_skipped(1.0, math.inf, fp16_scale, 1, 7, 1e-3, tcfg, last)


def tiny_step_setup(scaler_enabled: bool = False, init_scale: float = 2.0 ** 10):
    """A small model, Adam, one batch and a hook that puts an inf into one gradient when armed."""
    torch.manual_seed(0)
    cfg = ModelConfig(d_model=16, n_heads=2, d_ff=32, encoder_layers=1, decoder_layers=1, dropout=0.0,
                      attention_dropout=0.0, activation_dropout=0.0)
    model = build_model(cfg, 20, 0)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    scaler = torch.amp.GradScaler("cpu", init_scale=init_scale, enabled=scaler_enabled)
    src = torch.randint(4, 20, (2, 5))
    tgt = torch.randint(4, 20, (2, 6))
    batch = Batch(src, tgt[:, :-1], tgt[:, 1:], torch.arange(2))
    armed = {"inf": False}
    weight = next(p for p in model.parameters() if p.dim() == 2)

    def hook(grad):
        if armed["inf"]:
            grad = grad.clone()
            grad.view(-1)[0] = math.inf
        return grad

    weight.register_hook(hook)
    dist = distributed.Dist(0, 1, torch.device("cpu"))

    def step():
        return step_module.train_step(model, model, optimizer, scaler, [batch], 1e-3, 0.1, None, dist)

    return model, optimizer, scaler, armed, step


def test_an_inf_gradient_with_a_finite_loss_leaves_the_weights_unchanged():
    model, optimizer, _, armed, step = tiny_step_setup()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    armed["inf"] = True
    loss, *_, grad_norm = step()
    assert math.isfinite(loss) and grad_norm == math.inf
    for key, value in model.state_dict().items():
        assert torch.equal(value, before[key]), key
    assert not optimizer.state  # Adam never stepped: its moments hold no inf either
    armed["inf"] = False
    step()  # the next, finite update does step
    assert any(not torch.equal(v, before[k]) for k, v in model.state_dict().items())


def test_fp16_grad_scaler_lowers_its_scale_on_an_inf_gradient():
    model, _, scaler, armed, step = tiny_step_setup(scaler_enabled=True)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    armed["inf"] = True
    step()
    assert scaler.get_scale() == 2.0 ** 9
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())
    armed["inf"] = False
    step()
    assert scaler.get_scale() == 2.0 ** 9
    assert any(not torch.equal(v, before[k]) for k, v in model.state_dict().items())


def hook_first_parameter(monkeypatch, grad_at: Callable[[int, torch.Tensor], torch.Tensor]) -> dict:
    """Models built by the loop get a hook on their first parameter: backward pass n (from 1) turns its
    gradient into grad_at(n, grad). Returns the counter {"n": passes so far}."""
    real_build = loop_module.build_model
    backward = {"n": 0}

    def build(*args):
        model = real_build(*args)

        def hook(grad):
            backward["n"] += 1
            return grad_at(backward["n"], grad)

        next(model.parameters()).register_hook(hook)
        return model

    monkeypatch.setattr(loop_module, "build_model", build)
    return backward


def test_an_inf_gradient_in_training_is_skipped_and_counted(tmp_path, monkeypatch):
    def inf_at_update_3(n, grad):
        if n != 3:
            return grad
        grad = grad.clone()
        grad.view(-1)[0] = math.inf
        return grad

    backward = hook_first_parameter(monkeypatch, inf_at_update_3)
    metrics = loop_module.train(tiny_config(tmp_path, "run", "train.valid_bleu=false"))
    assert backward["n"] == 6 and metrics["status"] == "completed" and metrics["skipped_updates"] == 1
    ck = checkpoint.load(tmp_path / "run/checkpoints/last.pt")
    assert all(torch.isfinite(v).all() for v in ck["model"].values() if v.is_floating_point())


def test_fp16_overflows_are_counted_but_do_not_stop_the_run(tmp_path, monkeypatch):
    """GradScaler starts at a scale of 2^16, so early fp16 steps often overflow; each halves the
    scale and is skipped, and only a collapsed scale would count toward train.max_bad_steps."""
    hook_first_parameter(monkeypatch, lambda n, grad: grad * math.inf if n <= 4 else grad)
    monkeypatch.setattr(runtime, "autocast_dtype", lambda precision, device, setting: torch.float16)  # CPU: no CUDA
    metrics = loop_module.train(tiny_config(tmp_path, "run", "train.valid_bleu=false", "train.max_bad_steps=2"))
    # 4 injected overflows in a row (more than max_bad_steps), plus any the halved scales still cause
    assert metrics["status"] == "completed" and 4 <= metrics["skipped_updates"] < 6
    ck = checkpoint.load(tmp_path / "run/checkpoints/last.pt")
    assert ck["scaler"]["scale"] == 2.0 ** (16 - metrics["skipped_updates"])


def test_a_second_signal_stops_at_once():
    before = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
    with loop_module.stop_signals() as received:
        signal.raise_signal(signal.SIGTERM)
        assert received == {"signal": "SIGTERM"}  # the first one only asks the loop to stop
        with pytest.raises(KeyboardInterrupt, match="a second signal \\(SIGINT\\): stopped at once"):
            signal.raise_signal(signal.SIGINT)
    assert {s: signal.getsignal(s) for s in before} == before


def test_update_freq_accumulates_micro_batches(tmp_path):
    metrics = loop_module.train(tiny_config(tmp_path, "run", "train.update_freq=3", "train.max_steps=2",
                                            "train.valid_bleu=false"))
    ck = checkpoint.load(tmp_path / "run/checkpoints/last.pt")
    assert metrics["steps"] == 2 and ck["position"]["batch"] == 6


def test_frozen_parameters_keep_their_initial_values():
    """train.freeze: the a^V tables stay at their random initial values (issue 12's ablation);
    everything else trains. A pattern that matches nothing is an error naming the key."""
    from relmt.config import TrainConfig
    from relmt.train.optim import build_optimizer

    torch.manual_seed(0)
    cfg = ModelConfig(d_model=16, n_heads=2, d_ff=32, encoder_layers=1, decoder_layers=1, dropout=0.0,
                      attention_dropout=0.0, activation_dropout=0.0)
    model = build_model(cfg, 20, 0)
    optimizer = build_optimizer(model, TrainConfig(freeze=["*.rel.w_v"]))
    before = {k: v.clone() for k, v in model.state_dict().items()}
    src, tgt = torch.randint(4, 20, (2, 5)), torch.randint(4, 20, (2, 6))
    batch = Batch(src, tgt[:, :-1], tgt[:, 1:], torch.arange(2))
    scaler = torch.amp.GradScaler("cpu", enabled=False)
    step_module.train_step(model, model, optimizer, scaler, [batch], 1e-2, 0.1, None,
                           distributed.Dist(0, 1, torch.device("cpu")))
    frozen = [k for k in before if k.endswith("rel.w_v")]
    assert len(frozen) == 2  # encoder and decoder self-attention
    for key, value in model.state_dict().items():
        assert torch.equal(value, before[key]) == (key in frozen), key
    with pytest.raises(UserError, match="train.freeze: '.*w_q' matches no parameter"):
        build_optimizer(model, TrainConfig(freeze=["*.rel.w_q"]))
