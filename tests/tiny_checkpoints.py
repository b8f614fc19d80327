"""Untrained tiny checkpoints for the decoding tests (ensembles, sampling, reference scoring):
a sentencepiece model trained on toy sentences in well under a second, random weights, and the
payload relmt's trainer saves, so Translator.from_checkpoint(s) and relmt-translate read them as
they read real ones. Nothing is trained: the properties tested hold whatever the weights."""

from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path

import torch

from relmt import checkpoint
from relmt.config import Config, DataConfig, DecodeConfig, ModelConfig, to_dict
from relmt.data.tokenizer import EOS_ID, PAD_ID, Tokenizer, train_tokenizer
from relmt.data.toy import generate
from relmt.model.transformer import Transformer, build_model

SENTENCES = ["the dog saw the cat", "a small red bird sang", "alice said that bob arrived",
             "the old teachers near the river greeted my cats", "bob ran"]
# short outputs keep untrained models (which rarely choose EOS) cheap to decode
DECODE = DecodeConfig(beam=3, lenpen=0.6, max_len_a=0.0, max_len_b=8)


def toy_tokenizer(directory: Path, seed: int = 1, vocab_size: int = 120) -> Path:
    """A sentencepiece model on both sides of 300 toy sentence pairs (toy seed `seed`)."""
    path = directory / f"spm_{seed}_{vocab_size}.model"
    if not path.is_file():
        pairs = generate(seed=seed, n_train=300, n_valid=0, n_test=0, n_test_long=0)["train"]
        train_tokenizer([s for pair in pairs for s in pair], path, vocab_size, "bpe")
    return path


def model_config(**changes) -> ModelConfig:
    return ModelConfig(**{**dict(d_model=32, n_heads=4, d_ff=64, encoder_layers=2, decoder_layers=2,
                                 max_relative_position=4, dropout=0.0, attention_dropout=0.0,
                                 activation_dropout=0.0), **changes})


def random_model(cfg: ModelConfig, vocab_size: int, seed: int, eos_boost: float = 2.0) -> Transformer:
    torch.manual_seed(seed)
    model = build_model(cfg, vocab_size, PAD_ID).eval()
    with torch.no_grad():  # make EOS likely, so that hypotheses of different lengths finish and compete
        model.tgt_embed.weight[EOS_ID] *= eos_boost
    return model


def write_checkpoint(directory: Path, name: str, spm: Path, seed: int, model: ModelConfig | None = None,
                     decode: DecodeConfig = DECODE, eos_boost: float = 2.0, data: DataConfig | None = None) -> Path:
    """directory/name: a random model (torch seed `seed`) with the payload the trainer saves; `data` names its
    languages (default: the toy data's, src and tgt)."""
    cfg = Config(model=model or model_config(), decode=decode, data=data or DataConfig())
    net = random_model(cfg.model, Tokenizer(spm).vocab_size, seed, eos_boost)
    pieces = spm.read_bytes()
    payload = {"format": checkpoint.CHECKPOINT_FORMAT, "model": net.state_dict(), "config": to_dict(cfg),
               "spm": {"path": str(spm), "sha256": hashlib.sha256(pieces).hexdigest(), "model": pieces}, "step": 0}
    checkpoint.save(payload, directory, [name])
    return directory / name


# toy sentences for decoding a trained tiny model freely
TOY = ["the dog saw the cat", "a small red bird sang", "alice said that bob arrived",
       "the old teachers near the river greeted my cats", "bob ran", "every king quickly kissed some frogs",
       "my friend admired the green lake"]


def train_tiny(directory: Path, *overrides: str) -> Path:
    """The tiny preset trained for 300 updates on toy data (~15 s on a CPU): enough for it to end its
    outputs with EOS, so that hypotheses of many lengths compete. Returns the last checkpoint."""
    from relmt.config import compose
    from relmt.train.loop import train

    cfg = compose(["model=tiny", *overrides, "train=debug", "train.max_steps=300", "train.valid_bleu=false",
                   "train.eval_every=300", "train.save_every=300", "train.log_every=100", "train.warmup_steps=100",
                   "train.max_padded_tokens=1024", f"data.cache_dir={directory / 'cache'}", "data.toy.n_train=3000",
                   "data.toy.n_valid=10", "data.toy.n_test=10", "data.toy.n_test_long=10", "data.toy.max_words=8"])
    cfg.out_dir = str(directory / "run")
    train(cfg)
    return directory / "run" / "checkpoints" / "last.pt"


def shared_tiny(tmp_path_factory, name: str, *overrides: str) -> Path:
    """train_tiny's checkpoint made once per test run and shared by every pytest-xdist worker (their temporary
    folders' common parent; without xdist, this process's own): the first worker to need it trains it while the
    others wait, and the engine artefacts made next to it (relmt/export/engines.py, safe to race) are shared too, so
    that make test trains and compiles each once, whichever workers its tests land on."""
    from filelock import FileLock

    base = tmp_path_factory.getbasetemp()
    root = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base
    last = root / name / "run" / "checkpoints" / "last.pt"
    with FileLock(str(root / f"{name}.lock")):
        if not last.is_file():
            shutil.rmtree(root / name, ignore_errors=True)  # a worker killed while training
            train_tiny(root / name, *overrides)
    return last
