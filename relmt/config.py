"""Typed configuration schemas.

Hydra composes the YAML groups in configs/ on top of these dataclasses, so an unknown key or a
wrong type fails at compose time; `__post_init__` checks values and names the offending key.
`relmt.cli` converts the composed config once with `OmegaConf.to_object`, and from there on only
these dataclasses flow into the model, data, training and decoding code. Nothing here imports
Hydra at module level: `register_configs` does, and only the CLI calls it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path

from relmt.model.positions import PosKind


class Norm(str, Enum):
    pre = "pre"  # LayerNorm before each sublayer (tensor2tensor's default)
    post = "post"  # LayerNorm after each residual sum (Vaswani et al. 2017)


def _check(ok: bool, key: str, message: str) -> None:
    if not ok:
        raise ValueError(f"{key}: {message}")


@dataclass
class ModelConfig:
    """Model shape and position strategy (presets in configs/model/)."""

    d_model: int = 256
    n_heads: int = 4
    d_ff: int = 1024
    encoder_layers: int = 3
    decoder_layers: int = 3
    dropout: float = 0.1  # embeddings and residual connections
    attention_dropout: float = 0.1
    activation_dropout: float = 0.1
    norm: Norm = Norm.pre
    share_embeddings: bool = True  # source = target = output embedding (joint vocabulary)
    positions: PosKind = PosKind.rel
    max_relative_position: int = 16  # k: distances j - i are clipped to [-k, k] (Shaw §3.2)
    relative_keys: bool = True  # a^K (Shaw Table 3)
    relative_values: bool = True  # a^V (Shaw Table 3)
    relative_share_heads: bool = False  # one table per layer for all heads (big) or per head (base)

    def __post_init__(self) -> None:
        for name in ("d_model", "n_heads", "d_ff", "encoder_layers", "decoder_layers"):
            _check(getattr(self, name) >= 1, f"model.{name}", f"must be >= 1, got {getattr(self, name)}")
        _check(self.d_model % self.n_heads == 0, "model.n_heads",
               f"d_model={self.d_model} is not divisible by n_heads={self.n_heads}")
        _check(self.d_model % 2 == 0, "model.d_model", "must be even (sinusoidal encodings)")
        for name in ("dropout", "attention_dropout", "activation_dropout"):
            p = getattr(self, name)
            _check(0.0 <= p < 1.0, f"model.{name}", f"must be in [0, 1), got {p}")
        _check(self.max_relative_position >= 0, "model.max_relative_position",
               f"k must be >= 0, got {self.max_relative_position}")


@dataclass
class Config:
    """The root of a composed run configuration."""

    model: ModelConfig = field(default_factory=ModelConfig)
    seed: int = 1


def config_dir() -> Path:
    """configs/ inside an installed wheel, or at the top of a source checkout."""
    packaged = Path(__file__).parent / "configs"
    return packaged if packaged.is_dir() else Path(__file__).parent.parent / "configs"


def register_configs() -> None:
    """Register the schemas with Hydra's ConfigStore (configs/config.yaml lists `base_config`)."""
    from hydra.core.config_store import ConfigStore

    cs = ConfigStore.instance()
    cs.store(name="base_config", node=Config)


def to_config(cfg) -> Config:
    """A composed DictConfig -> typed `Config`, running every `__post_init__` check."""
    from omegaconf import OmegaConf

    return OmegaConf.to_object(cfg)


def compose(overrides: list[str] | None = None, config_name: str = "config") -> Config:
    """Compose configs/ with Hydra overrides outside a Hydra app (tests, notebooks, scripts)."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    register_configs()
    with initialize_config_dir(str(config_dir()), version_base=None):
        return to_config(hydra_compose(config_name, overrides=overrides or []))
