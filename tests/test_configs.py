"""Every config file composes against the dataclass schemas and builds a model on CPU."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch
from hydra.errors import ConfigCompositionException
from omegaconf.errors import OmegaConfBaseException

from relmt import config
from relmt.config import (
    CheckpointRule,
    LrSchedule,
    ModelConfig,
    PosKind,
    TrainConfig,
    compose,
    config_dir,
    from_dict,
    to_dict,
    upgrade_config,
)
from relmt.model.transformer import build_model
from relmt.train.optim import learning_rate

MODEL_PRESETS = sorted(p.stem for p in (config_dir() / "model").glob("*.yaml"))


def test_presets_exist():
    assert {"tiny", "small", "base", "big"} <= set(MODEL_PRESETS)


@pytest.mark.parametrize("preset", MODEL_PRESETS)
def test_model_preset_composes_and_builds(preset):
    cfg = compose([f"model={preset}"])
    assert isinstance(cfg.model, ModelConfig)
    assert isinstance(cfg.model.positions, PosKind)
    if preset in ("base", "big"):  # keep the test light: build a 1-layer version of the shape
        cfg.model.encoder_layers = cfg.model.decoder_layers = 1
    model = build_model(cfg.model, vocab_size=64, pad_id=0)
    logits = model(torch.tensor([[5, 6, 3]]), torch.tensor([[2, 7]]))
    assert logits.shape == (1, 2, 64)


def test_paper_presets_follow_section_4_1():
    base, big = compose(["model=base"]).model, compose(["model=big"]).model
    assert (base.d_model, base.n_heads, base.d_ff, base.max_relative_position) == (512, 8, 2048, 16)
    assert (big.d_model, big.n_heads, big.d_ff, big.max_relative_position) == (1024, 16, 4096, 8)
    assert not base.relative_share_heads and big.relative_share_heads
    assert base.d_model // base.n_heads == big.d_model // big.n_heads == 64


@pytest.mark.parametrize("mode", ["abs", "rel", "both", "none"])
def test_positions_override(mode):
    assert compose([f"model.positions={mode}"]).model.positions == PosKind(mode)


@pytest.mark.parametrize("override,match", [
    (["model.max_relative_position=-1"], "model.max_relative_position"),
    (["model.n_heads=3"], "model.n_heads"),
    (["model.dropout=1.5"], "model.dropout"),
    (["model.positions=rope", "model.d_model=12", "model.n_heads=4"], "positions=rope turns pairs"),
])
def test_bad_values_fail_naming_the_key(override, match):
    with pytest.raises(ValueError, match=match):
        compose(override)


@pytest.mark.parametrize("override,match", [
    (["model.positions=relative"], "positions"),
    (["model.not_a_field=1"], "not_a_field"),
    (["model.d_model=big"], "d_model"),
    (["model=huge"], "huge"),
    (["train.test_checkpoint=newest"], "test_checkpoint"),
    (["train.lr=0.001"], "lr"),
    (["train.max_tokens=4096"], "max_tokens"),
])
def test_bad_keys_and_types_fail_at_compose(override, match):
    with pytest.raises((ConfigCompositionException, OmegaConfBaseException), match=match):
        compose(override)


def test_configs_dir_is_the_repo_one():
    assert config_dir().resolve() == (Path(__file__).parents[1] / "configs").resolve()


GROUPS = {group: sorted(p.stem for p in (config_dir() / group).glob("*.yaml"))
          for group in ("data", "train", "decode")}
NEEDS = {"text": ["data.dir=some/folder"], "multi30k_text": ["data.dir=some/folder"]}


@pytest.mark.parametrize("group,option", [(g, o) for g, opts in GROUPS.items() for o in opts])
def test_every_group_option_composes_and_builds(group, option):
    cfg = compose([f"{group}={option}", *NEEDS.get(option, [])])
    assert getattr(cfg, group) is not None
    model = build_model(cfg.model, vocab_size=32, pad_id=0)
    assert model(torch.tensor([[5, 3]]), torch.tensor([[2]])).shape == (1, 1, 32)


def test_text_data_without_a_folder_is_a_clear_error():
    with pytest.raises(ValueError, match="data.dir: is required for source=text"):
        compose(["data=text"])


SCHEMAS = [v for v in vars(config).values() if dataclasses.is_dataclass(v) and v.__module__ == config.__name__]


@pytest.mark.parametrize("schema", SCHEMAS, ids=lambda c: c.__name__)
def test_every_schema_is_valid_with_its_own_defaults(schema):
    schema()  # __post_init__ raises ValueError on an invalid default


def test_the_schemas_are_all_found():
    assert {"Config", "ModelConfig", "DataConfig", "ToyConfig", "TrainConfig", "DecodeConfig"} <= {
        s.__name__ for s in SCHEMAS}


def test_each_schedule_reads_only_its_own_field():
    noam = TrainConfig(lr_schedule=LrSchedule.noam, noam_scale=2.0, warmup_steps=4000)
    assert learning_rate(noam, 512, 4000) == pytest.approx(2.0 * 512 ** -0.5 * 4000 ** -0.5)
    assert learning_rate(dataclasses.replace(noam, peak_lr=7.0), 512, 4000) == learning_rate(noam, 512, 4000)
    inverse_sqrt = TrainConfig(lr_schedule=LrSchedule.inverse_sqrt, peak_lr=0.002, warmup_steps=100)
    assert learning_rate(inverse_sqrt, 512, 100) == pytest.approx(0.002)
    assert learning_rate(dataclasses.replace(inverse_sqrt, noam_scale=7.0), 512, 100) == pytest.approx(0.002)


@pytest.mark.parametrize("preset", GROUPS["train"])
@pytest.mark.parametrize("schedule", [s.value for s in LrSchedule])
def test_switching_the_schedule_keeps_the_peak_learning_rate_sane(preset, schedule):
    """Issue 13: one train.lr was the Noam scale (~2) and the inverse_sqrt peak (~0.002), so a
    switch of schedule alone gave a rate ~1000x off. With a field per schedule, every preset under
    either schedule peaks (at warmup_steps, base model width) between 1e-4 and 5e-2."""
    train = compose([f"train={preset}", f"train.lr_schedule={schedule}"]).train
    assert 1e-4 <= learning_rate(train, 512, train.warmup_steps) <= 5e-2


def test_test_checkpoint_is_an_enum():
    assert compose(["train=wmt_big"]).train.test_checkpoint is CheckpointRule.averaged
    with pytest.raises(ValueError, match="train.test_checkpoint: averaged needs train.average_last > 0"):
        TrainConfig(test_checkpoint=CheckpointRule.averaged)


@pytest.mark.parametrize("schedule,field", [("noam", "noam_scale"), ("inverse_sqrt", "peak_lr")])
def test_a_config_saved_before_the_renames_reads_under_the_new_names(schedule, field):
    saved = to_dict(compose([f"train.lr_schedule={schedule}"]))
    train = saved["train"]
    train["lr"], train["max_tokens"] = 0.123, train.pop("max_padded_tokens")
    del train["noam_scale"], train["peak_lr"]
    cfg = from_dict(saved)
    assert getattr(cfg.train, field) == 0.123 and cfg.train.max_padded_tokens == 4096
    assert upgrade_config(to_dict(cfg)) == to_dict(cfg)  # a current config comes back as it was


def test_a_config_saved_with_train_num_threads_reads_as_threads():
    """Issue 74 §2: train.num_threads became the top-level threads, every command's name for it."""
    saved = to_dict(compose([]))
    del saved["threads"]
    saved["train"]["num_threads"] = 3
    cfg = from_dict(saved)
    assert cfg.threads == 3 and not hasattr(cfg.train, "num_threads")
