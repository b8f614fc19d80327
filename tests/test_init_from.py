"""Fine-tuning (train.init_from): a new run starts from a checkpoint's weights with a fresh optimizer,
schedule and data position; the model config must match, and another vocabulary keeps the rows of the pieces
both hold; resume takes precedence."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from relmt import checkpoint
from relmt.errors import UserError
from relmt.train import init
from relmt.train import loop as loop_module
from relmt.train.optim import learning_rate
from tests.test_train import no_data, tiny_config, train_records

QUIET = ("train.valid_bleu=false",)  # validation by loss only: the runs here test weights, not BLEU


@pytest.fixture(scope="module")
def source(tmp_path_factory) -> tuple[Path, Path]:
    """(the folder holding the data cache and runs, the last.pt of a 3-update source run)."""
    root = tmp_path_factory.mktemp("init_from")
    loop_module.train(tiny_config(root, "source", *QUIET, "train.max_steps=3"))
    return root, root / "source/checkpoints/last.pt"


def spy_first_update(monkeypatch) -> dict:
    """What the first call of train_step sees: the weights, the optimizer's state and the lr."""
    seen: dict = {}
    real = loop_module.train_step

    def train_step(model, net, optimizer, scaler, batches, lr, *args, **kwargs):
        if not seen:
            seen.update(weights={k: v.clone() for k, v in model.state_dict().items()},
                        optimizer_state=dict(optimizer.state), lr=lr)
        return real(model, net, optimizer, scaler, batches, lr, *args, **kwargs)

    monkeypatch.setattr(loop_module, "train_step", train_step)
    return seen


@pytest.mark.parametrize("averaged", [False, True], ids=["last", "averaged"])
def test_init_from_starts_with_the_weights_and_a_fresh_optimizer_schedule_and_position(source, monkeypatch,
                                                                                      averaged):
    """At the first update the weights are the checkpoint's, Adam holds no state and the lr is warm-up's
    first; afterwards the step, Adam's own step count and the data position count from 0, not from the
    source's 3. A checkpoint written by relmt-average (no optimizer inside) works as well."""
    root, path = source
    if averaged:
        avg = checkpoint.average(checkpoint.step_files(path.parent))
        checkpoint.save(avg, root, ["averaged.pt"])
        path = root / "averaged.pt"
    src = checkpoint.load(path)
    assert checkpoint.load(root / "source/checkpoints/last.pt")["optim"]["state"]  # the source's Adam has moments
    seen = spy_first_update(monkeypatch)
    name = f"tuned_{averaged}"
    cfg = tiny_config(root, name, *QUIET, "train.max_steps=2", f"train.init_from={path}")
    metrics = loop_module.train(cfg)
    assert seen["weights"].keys() == src["model"].keys()
    for key, value in src["model"].items():
        assert torch.equal(seen["weights"][key], value), key
    assert seen["optimizer_state"] == {}
    assert seen["lr"] == learning_rate(cfg.train, cfg.model.d_model, 1) == pytest.approx(0.002 / 4)
    ck = checkpoint.load(root / name / "checkpoints/last.pt")
    assert ck["step"] == 2 and ck["position"] == {"epoch": 0, "batch": 2}
    assert {int(s["step"]) for s in ck["optim"]["state"].values()} == {2}  # Adam's bias correction restarts
    record = {"path": str(path), "step": 3, "checksum": src["checksum"]}
    assert metrics["init_from"] == record and ck["state"]["init_from"] == record
    assert json.loads((root / name / "metrics.json").read_text())["init_from"] == record
    assert ck["config"]["train"]["init_from"] == str(path)


def test_a_run_without_init_from_records_none(source):
    root, _ = source
    metrics = json.loads((root / "source/metrics.json").read_text())
    assert metrics["init_from"] is None and metrics["stopped_early"] is None


def test_a_different_model_config_is_refused_naming_each_key_before_the_data_work(source, monkeypatch):
    root, path = source
    no_data(monkeypatch)
    with pytest.raises(UserError, match=rf"train.init_from={path}: its model differs from this run's: "
                                        r"model.d_model=48 \(checkpoint: 32\); fine-tuning keeps the model"):
        loop_module.train(tiny_config(root, "bad", f"train.init_from={path}", "model.d_model=48"))
    with pytest.raises(UserError, match=r"model.positions=abs \(checkpoint: rel\), "
                                        r"model.max_relative_position=8 \(checkpoint: 4\)"):
        loop_module.train(tiny_config(root, "bad", f"train.init_from={path}", "model.positions=abs",
                                      "model.max_relative_position=8"))


def test_dropouts_and_the_preset_name_may_differ():
    saved = {"name": "tiny", "d_model": 32, "dropout": 0.1, "attention_dropout": 0.1, "norm": "pre"}
    init.check_model(saved, {**saved, "name": "", "dropout": 0.3, "attention_dropout": 0.0}, Path("x.pt"))
    with pytest.raises(UserError, match=r"model.norm=post \(checkpoint: pre\)"):
        init.check_model(saved, {**saved, "dropout": 0.3, "norm": "post"}, Path("x.pt"))


def test_another_vocabulary_keeps_the_rows_of_the_shared_pieces_and_starts_the_rest_fresh(source, monkeypatch):
    """Issue 61: a checkpoint trained with another sentencepiece model (here 638 pieces, the run 60) is taken onto
    the run's: each piece both hold keeps its embedding (and tied output) row, matched by its text; the others
    are the fresh model's; every other weight is the checkpoint's; metrics.json says how many rows were kept."""
    root, path = source
    src = checkpoint.load(path)
    seen = spy_first_update(monkeypatch)
    fresh = {}
    real_build = loop_module.build_model

    def build_model(*args, **kwargs):
        model = real_build(*args, **kwargs)
        fresh.update({k: v.clone() for k, v in model.state_dict().items()})
        return model

    monkeypatch.setattr(loop_module, "build_model", build_model)
    metrics = loop_module.train(tiny_config(root, "vocab", *QUIET, "train.max_steps=1", f"train.init_from={path}",
                                            "data.vocab_size=60"))
    ours, theirs = init.pieces(checkpoint.load(root / "vocab/checkpoints/last.pt")["spm"]), init.pieces(src["spm"])
    old = {p: i for i, p in enumerate(theirs)}
    shared = [i for i, p in enumerate(ours) if p in old]
    assert metrics["init_from"]["vocabulary"] == {"kept": len(shared), "rows": 60, "checkpoint_rows": 638}
    assert len(shared) >= 4  # the special pieces at least (here all 60: BPE's first merges are the larger's too)
    for key in ("src_embed.weight", "tgt_embed.weight"):
        table = seen["weights"][key]
        for i, p in enumerate(ours):
            expected = src["model"][key][old[p]] if p in old else fresh[key][i]
            assert torch.equal(table[i], expected), (key, p)
    for key, value in src["model"].items():
        if "embed" not in key:
            assert torch.equal(seen["weights"][key], value), key


def test_onto_vocabulary_copies_shared_rows_by_piece_and_keeps_the_fresh_ones(tmp_path):
    from relmt.config import ModelConfig
    from relmt.data.tokenizer import PAD_ID, Tokenizer
    from relmt.model.transformer import build_model
    from tests.tiny_checkpoints import toy_tokenizer

    spms = [toy_tokenizer(tmp_path, seed=s, vocab_size=v) for s, v in ((1, 120), (2, 150))]
    entries = [{"path": str(p), "sha256": str(i), "model": p.read_bytes()} for i, p in enumerate(spms)]
    sizes = [Tokenizer(p).vocab_size for p in spms]
    cfg = ModelConfig(d_model=16, n_heads=2, d_ff=32, encoder_layers=1, decoder_layers=1)
    old, new = (build_model(cfg, n, PAD_ID) for n in sizes)
    weights, kept = init.onto_vocabulary(old.state_dict(), new, entries[0], entries[1], Path("a.pt"))
    theirs, ours = init.pieces(entries[0]), init.pieces(entries[1])
    shared = [p for p in ours if p in theirs]
    assert kept == {"kept": len(shared), "rows": sizes[1], "checkpoint_rows": sizes[0]} and len(shared) < sizes[1]
    for i, p in enumerate(ours):
        want = old.state_dict()["tgt_embed.weight"][theirs.index(p)] if p in theirs else \
            new.state_dict()["tgt_embed.weight"][i]
        assert torch.equal(weights["tgt_embed.weight"][i], want), p
    assert all(torch.equal(weights[k], v) for k, v in old.state_dict().items() if "embed" not in k)


def test_a_missing_or_damaged_source_is_a_clear_error(source, monkeypatch, tmp_path):
    root, path = source
    no_data(monkeypatch)
    with pytest.raises(UserError, match=r"train.init_from: .*nothing.pt: no such checkpoint"):
        loop_module.train(tiny_config(root, "bad", f"train.init_from={tmp_path / 'nothing.pt'}"))
    ck = checkpoint.load(path)
    ck["model"] = {k: v + 1 if v.is_floating_point() else v for k, v in ck["model"].items()}
    torch.save({**ck, "checksum": ck["checksum"]}, tmp_path / "tampered.pt")  # old checksum, new weights
    with pytest.raises(UserError, match=r"train.init_from: .*tampered.pt: checksum mismatch"):
        loop_module.train(tiny_config(root, "bad", f"train.init_from={tmp_path / 'tampered.pt'}"))


def test_resume_takes_precedence_over_init_from(source, caplog):
    """The same command, requeued: the first start (no checkpoint yet) starts from init_from; the
    second continues its own run and does not load init_from again, and equals a run that was not
    stopped."""
    root, path = source
    common = (*QUIET, f"train.init_from={path}", "train.resume=true", "train.save_every=2", "train.eval_every=2")
    with caplog.at_level("INFO"):
        loop_module.train(tiny_config(root, "requeued", *common, "train.max_steps=2"))
        assert "no checkpoint in" in caplog.text and "the run starts from train.init_from" in caplog.text
        caplog.clear()
        metrics = loop_module.train(tiny_config(root, "requeued", *common, "train.max_steps=4"))
    assert f"train.init_from={path} is not loaded: train.resume continues this run" in caplog.text
    assert "resumed from" in caplog.text
    assert metrics["steps"] == 4 and metrics["init_from"]["path"] == str(path)  # kept from the first start
    loop_module.train(tiny_config(root, "straight", *common, "train.max_steps=4"))
    a, b = train_records(root / "requeued"), train_records(root / "straight")
    assert sorted(a) == sorted(b) == [1, 2, 3, 4]
    assert [a[s]["loss"] for s in a] == [b[s]["loss"] for s in a]


def test_frozen_parameters_keep_the_loaded_values(source):
    """train.freeze with init_from: the matched parameters stay at the checkpoint's values (not at a
    fresh random init); the others train on."""
    root, path = source
    src = checkpoint.load(path)["model"]
    loop_module.train(tiny_config(root, "frozen", *QUIET, "train.max_steps=2", f"train.init_from={path}",
                                  "train.freeze=[*.rel.w_v]"))
    tuned = checkpoint.load(root / "frozen/checkpoints/last.pt")["model"]
    frozen = [k for k in src if k.endswith("rel.w_v")]
    assert len(frozen) == 4  # two encoder and two decoder self-attention layers
    for key in src:
        assert torch.equal(tuned[key], src[key]) == (key in frozen), key
