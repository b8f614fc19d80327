"""Every config file composes against the dataclass schemas and builds a model on CPU."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from hydra.errors import ConfigCompositionException
from omegaconf.errors import OmegaConfBaseException

from relmt.config import ModelConfig, PosKind, compose, config_dir
from relmt.model.transformer import build_model

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
])
def test_bad_values_fail_naming_the_key(override, match):
    with pytest.raises(ValueError, match=match):
        compose(override)


@pytest.mark.parametrize("override,match", [
    (["model.positions=relative"], "positions"),
    (["model.not_a_field=1"], "not_a_field"),
    (["model.d_model=big"], "d_model"),
    (["model=huge"], "huge"),
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
