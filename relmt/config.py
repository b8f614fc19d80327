"""Typed configuration schemas.

Hydra composes the YAML groups in configs/ on top of these dataclasses, so an unknown key or a
wrong type fails at compose time; `__post_init__` checks values and names the offending key.
`relmt.cli` converts the composed config once with `OmegaConf.to_object`, and from there on only
these dataclasses flow into the model, data, training and decoding code. Nothing here imports
Hydra at module level: `register_configs` does, and only the CLI calls it.
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any


class PosKind(str, Enum):
    """The single switch for position information (relmt/model/positions.py builds each kind)."""

    abs = "abs"  # sinusoidal encodings added to the embeddings (Vaswani §3.5)
    rel = "rel"  # Shaw §3: a^K, a^V inside encoder and decoder self-attention only
    both = "both"  # sinusoidal inputs plus relative attention (Shaw §4.3: no further gain)
    none = "none"  # no position information at all (Shaw Table 2, k = 0 row)
    # Beyond the paper, each in encoder and decoder self-attention only, without sinusoidal inputs:
    rope = "rope"  # rotary embeddings of q and k (Su et al. 2021), base 10000
    alibi = "alibi"  # fixed per-head linear distance penalties (Press et al. 2022)
    t5 = "t5"  # learned per-head biases over 32 log-spaced distance buckets (Raffel et al. 2020)

    @property
    def absolute(self) -> bool:
        return self in (PosKind.abs, PosKind.both)

    @property
    def relative(self) -> bool:
        return self in (PosKind.rel, PosKind.both)


class Norm(str, Enum):
    pre = "pre"  # LayerNorm before each sublayer (tensor2tensor's default)
    post = "post"  # LayerNorm after each residual sum (Vaswani et al. 2017)


MAX_LENPEN = 10.0  # decode.lenpen's upper bound: 1000^10 and ((5 + 1000) / 6)^10 are far inside float32's range


def _check(ok: bool, key: str, message: str) -> None:
    if not ok:
        raise ValueError(f"{key}: {message}")


@dataclass
class ModelConfig:
    """Model shape and position strategy (presets in configs/model/)."""

    # the preset's name: configs/model/<name>.yaml sets it, and each run's config.yaml records it, so
    # that relmt-report groups runs by it rather than guessing the size from d_model; "" = no preset
    name: str = ""
    d_model: int = 256  # model width (Shaw §4.1: 512 base, 1024 big)
    n_heads: int = 4  # attention heads; d_head = d_model / n_heads
    d_ff: int = 1024  # inner width of the feed-forward sublayers
    encoder_layers: int = 3  # encoder layers (6 in the paper)
    decoder_layers: int = 3  # decoder layers (6 in the paper)
    dropout: float = 0.1  # embeddings and residual connections
    attention_dropout: float = 0.1  # dropout on the attention probabilities
    activation_dropout: float = 0.1  # dropout after the feed-forward sublayer's ReLU
    norm: Norm = Norm.pre  # where LayerNorm sits: pre or post (see Norm)
    share_embeddings: bool = True  # source = target = output embedding (joint vocabulary)
    positions: PosKind = PosKind.rel  # the position encoding: abs, rel (Shaw), both, none, rope, alibi, t5
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
        _check(self.positions != PosKind.rope or (self.d_model // self.n_heads) % 2 == 0, "model.n_heads",
               f"positions=rope turns pairs of dimensions, so d_model / n_heads must be even, got "
               f"{self.d_model}/{self.n_heads}")
        for name in ("dropout", "attention_dropout", "activation_dropout"):
            p = getattr(self, name)
            _check(0.0 <= p < 1.0, f"model.{name}", f"must be in [0, 1), got {p}")
        _check(self.max_relative_position >= 0, "model.max_relative_position",
               f"k must be >= 0, got {self.max_relative_position}")


class Source(str, Enum):
    toy = "toy"  # the synthetic corpus generated from a seed (relmt.data.toy); no download
    text = "text"  # a folder of {split}.{lang} plain-text files
    hf = "hf"  # datasets.load_dataset: a Hub id, a local save_to_disk folder, or parquet/json files
    corpora = "corpora"  # several corpora, each a toy, text or hf source with a weight (data.corpora)


class SpmModel(str, Enum):
    bpe = "bpe"
    unigram = "unigram"
    word = "word"
    char = "char"


class SpmNormalization(str, Enum):
    """sentencepiece's `normalization_rule_name`: how text is rewritten before it is split into pieces.

    The rule is stored in the model and applied to every input, and decoding cannot undo it. Every
    rule but identity rewrites characters ('…' -> '...', '½' -> '1⁄2', 'ﬁ' -> 'fi', no-break space ->
    space), so a hypothesis could never match those characters in a raw reference.
    """

    identity = "identity"  # keep the text as it is (the default)
    nfkc = "nfkc"
    nmt_nfkc = "nmt_nfkc"  # sentencepiece's own default: NFKC, and control characters removed
    nfkc_cf = "nfkc_cf"  # NFKC and Unicode case folding
    nmt_nfkc_cf = "nmt_nfkc_cf"


@dataclass
class ToyConfig:
    """Sizes of the synthetic corpus (relmt/data/toy.py); sentence lengths are in words."""

    seed: int = 1  # generator seed: the same seed gives the same corpus
    n_train: int = 20000  # training pairs
    n_valid: int = 500  # validation pairs
    n_test: int = 500  # test pairs (1..max_words words)
    n_test_long: int = 500  # test_long pairs (max_words+1..2*max_words words: length generalisation)
    max_words: int = 16  # L: train/valid/test have 1..L words, test_long has L+1..2L


@dataclass
class CorpusConfig:
    """One corpus of data.corpora (source=corpora; relmt/data/mix.py): where its pairs come from, as a
    one-corpus data config says it, and its share of the training batches."""

    name: str = "???"  # a label: its evaluation splits are {name}_{split}, and the mix is logged by it
    source: Source = Source.text  # toy | text | hf
    src: str | None = None  # its language codes; default data.src and data.tgt
    tgt: str | None = None
    splits: dict[str, str] = field(default_factory=dict)  # as data.splits: "train" required, "valid" optional
    dir: str | None = None  # source=text
    hf_path: str | None = None  # source=hf, with hf_name and hf_revision as data's
    hf_name: str | None = None
    hf_revision: str | None = None
    toy: ToyConfig = field(default_factory=ToyConfig)  # source=toy
    weight: float = 1.0  # its share of each epoch's training pairs is weight / (the sum of the weights)


def source_checkout() -> Path | None:
    """The source checkout relmt runs from (relmt/ beside pyproject.toml: the tree itself or an editable
    install), or None for an installed wheel."""
    root = Path(__file__).resolve().parent.parent
    return root if (root / "pyproject.toml").is_file() else None


def default_cache_dir() -> str:
    """data.cache_dir's default: data/cache in a source checkout (gitignored; relative to the working
    directory), else the user's cache directory, $XDG_CACHE_HOME/relmt or ~/.cache/relmt (the XDG
    base directory rule), so that an installed relmt does not fill ./data/cache wherever it runs."""
    if source_checkout() is not None:
        return "data/cache"
    xdg = os.environ.get("XDG_CACHE_HOME", "")
    return str((Path(xdg) if os.path.isabs(xdg) else Path.home() / ".cache") / "relmt")


@dataclass
class DataConfig:
    """One corpus and how it becomes token ids (presets in configs/data/)."""

    name: str = "toy"  # a label for logs and the cache directory
    source: Source = Source.toy  # toy | text | hf (see Source)
    src: str = "src"  # language codes: file suffixes, column names or translation keys
    tgt: str = "tgt"  # the target language code, as data.src
    # canonical split -> the source's split name; "train" and "valid" are required, every other
    # key is a test set (e.g. test: newstest2014). Ignored for toy, which has fixed splits.
    splits: dict[str, str] = field(default_factory=dict)
    dir: str | None = None  # source=text: the folder holding {split}.{lang}
    hf_path: str | None = None  # source=hf: Hub id or local path
    hf_name: str | None = None  # source=hf: Hub config, e.g. "de-en"
    hf_revision: str | None = None  # source=hf: pin a Hub revision for reproducibility
    toy: ToyConfig = field(default_factory=ToyConfig)
    # joint sentencepiece vocabulary, trained on the training split (both sides)
    vocab_size: int = 8000
    spm_model_type: SpmModel = SpmModel.bpe  # sentencepiece's model type: bpe, unigram, word or char
    spm_character_coverage: float = 1.0  # sentencepiece's character_coverage (1.0: every character kept)
    spm_input_sentence_size: int = 2_000_000  # sentences sampled for spm training on big corpora
    # identity: decoding gives back the input's characters (outer spaces trimmed, runs squeezed)
    spm_normalization: SpmNormalization = SpmNormalization.identity
    # lowercase every input, as the Multi30k literature's data are (Wu et al. 2021): a sentencepiece
    # rule table (str.lower of each character), stored in the model, so training, translation and
    # export all see lowercased text, and the model writes lowercase. Needs spm_normalization=identity.
    lowercase: bool = False
    # Subword regularisation (relmt/data/regularise.py; Kudo 2018): each epoch the training sentences are cut
    # anew by sampling; 0 = off. unigram: the smoothing alpha of the sampled segmentation (Kudo: 0.1-0.5); bpe:
    # BPE-dropout's probability of dropping each merge (Provilkov et al. 2020: 0.1). Validation, the test
    # splits and translation never sample.
    spm_alpha: float = 0.0
    spm_nbest: int = -1  # unigram only: sample among the nbest best segmentations (-1: all of them)
    # training-pair filters (evaluation splits are never filtered)
    max_tokens_per_side: int = 256
    max_length_ratio: float = 3.0  # drop pairs whose longer side exceeds ratio x the shorter; 0 = off
    # drop training pairs whose source has more words (whitespace-separated) than this; 0 = off. For
    # length generalisation (Shaw §3.2: clipping lets a model meet lengths unseen in training)
    train_max_src_words: int = 0
    cache_dir: str = field(default_factory=default_cache_dir)  # data/cache in a checkout, else ~/.cache/relmt
    num_proc: int = 1  # processes that encode the splits (relmt-prepare), 10,000 pairs a task
    # upper edges (source words) of the buckets for BLEU by source length, reported on the test splits
    length_buckets: list[int] = field(default_factory=lambda: [10, 20, 30, 40, 60])
    # source=corpora: the corpora, each with its weight (docs/data.md, "Several corpora"). An epoch draws as
    # many training pairs as all corpora hold, each corpus its weight's share of them.
    corpora: list[CorpusConfig] = field(default_factory=list)
    valid_corpus: str = ""  # source=corpora: whose valid split validates (best.pt); "" = the first with one
    # Johnson et al. 2017: the target-language tag <2xx> (xx: the pair's tgt code) starts every source, a
    # user-defined symbol of the joint sentencepiece model; translation takes tgt_lang=xx
    lang_tags: bool = False

    def __post_init__(self) -> None:
        if self.source == Source.corpora:
            self._check_corpora()
        elif self.source != Source.toy:
            for split in ("train", "valid"):
                _check(split in self.splits, "data.splits",
                       f"must map '{split}' to a split of the source, got {dict(self.splits)}")
        _check(self.source != Source.text or bool(self.dir), "data.dir",
               f"is required for source=text: the folder of the {{split}}.{{{self.src},{self.tgt}}} files "
               f"(splits {', '.join(self.splits.values())}), e.g. data.dir=path/to/corpus")
        _check(self.source != Source.hf or bool(self.hf_path), "data.hf_path", "is required for source=hf")
        _check(self.src != self.tgt, "data.tgt", f"must differ from data.src ({self.src})")
        _check(self.vocab_size >= 8, "data.vocab_size", f"must be >= 8, got {self.vocab_size}")
        _check(self.max_tokens_per_side >= 1, "data.max_tokens_per_side", "must be >= 1")
        _check(self.max_length_ratio == 0 or self.max_length_ratio >= 1, "data.max_length_ratio",
               f"must be 0 (off) or >= 1, got {self.max_length_ratio}")
        _check(self.train_max_src_words >= 0, "data.train_max_src_words",
               f"must be 0 (off) or >= 1, got {self.train_max_src_words}")
        _check(self.num_proc >= 1, "data.num_proc", "must be >= 1")
        _check(len(self.length_buckets) > 0 and list(self.length_buckets) == sorted(set(self.length_buckets))
               and self.length_buckets[0] >= 1, "data.length_buckets",
               f"must be increasing edges >= 1, got {list(self.length_buckets)}")
        _check(0 < self.spm_character_coverage <= 1, "data.spm_character_coverage", "must be in (0, 1]")
        _check(0 <= self.spm_alpha < 1 or (self.spm_model_type == SpmModel.unigram and self.spm_alpha >= 0
                                           and self.spm_alpha < float("inf")), "data.spm_alpha",
               f"must be 0 (off) or a probability in (0, 1) for bpe, >= 0 for unigram; got {self.spm_alpha}")
        _check(self.spm_alpha == 0 or self.spm_model_type in (SpmModel.bpe, SpmModel.unigram), "data.spm_alpha",
               f"samples segmentations of bpe and unigram models; spm_model_type={self.spm_model_type.value} has one")
        _check(self.spm_nbest == -1 or self.spm_nbest >= 1, "data.spm_nbest",
               f"must be -1 (all) or >= 1, got {self.spm_nbest}")
        _check(not self.lowercase or self.spm_normalization == SpmNormalization.identity, "data.lowercase",
               f"needs data.spm_normalization=identity (got {self.spm_normalization.value}): sentencepiece "
               "takes one rule table, and lowercasing is one")
        _check(self.source == Source.corpora or not self.corpora, "data.corpora",
               f"needs data.source=corpora (got {getattr(self.source, 'value', self.source)})")
        _check(self.source == Source.corpora or not self.lang_tags, "data.lang_tags",
               "tags the sources of several language pairs: it needs data.source=corpora")
        t = self.toy
        _check(t.max_words >= 2, "data.toy.max_words", "must be >= 2")
        for name in ("n_train", "n_valid", "n_test", "n_test_long"):
            _check(getattr(t, name) >= 0, f"data.toy.{name}", "must be >= 0")


    def _check_corpora(self) -> None:
        _check(len(self.corpora) >= 1, "data.corpora", "source=corpora needs at least one corpus")
        names = [c.name for c in self.corpora]
        for i, c in enumerate(self.corpora):
            key = f"data.corpora[{i}]"
            _check(c.name not in ("", "???") and c.name.replace("_", "").replace("-", "").isalnum(), f"{key}.name",
                   f"must be a label of letters, digits, - and _, got {c.name!r}")
            _check(c.name not in names[:i], f"{key}.name", f"{c.name!r} names two corpora")
            clash = next((o for o in names if o != c.name and c.name.startswith(f"{o}_")), None)
            _check(clash is None, f"{key}.name", f"{c.name!r} begins with another corpus's name and '_' ({clash!r}): "
                   "its split names ({name}_{split}) could not be told apart; rename one")
            _check(c.source != Source.corpora, f"{key}.source", "must be toy, text or hf")
            _check(c.weight >= 0 and c.weight < float("inf"), f"{key}.weight", f"must be >= 0, got {c.weight}")
            _check(c.source == Source.toy or "train" in c.splits, f"{key}.splits",
                   f"must map 'train' to a split of the source, got {dict(c.splits)}")
            _check(c.source != Source.text or bool(c.dir), f"{key}.dir", "is required for source=text")
            _check(c.source != Source.hf or bool(c.hf_path), f"{key}.hf_path", "is required for source=hf")
            _check((c.src or self.src) != (c.tgt or self.tgt), f"{key}.tgt", "must differ from its src")
        _check(sum(c.weight for c in self.corpora) > 0, "data.corpora", "needs a weight > 0")
        with_valid = [c.name for c in self.corpora if c.source == Source.toy or "valid" in c.splits]
        _check(bool(with_valid), "data.corpora", "no corpus has a valid split: map 'valid' in one's splits")
        _check(not self.valid_corpus or self.valid_corpus in with_valid, "data.valid_corpus",
               f"must name a corpus with a valid split ({', '.join(with_valid)}), got {self.valid_corpus!r}")
        _check(not self.dir and not self.hf_path and not self.splits, "data.dir",
               "source=corpora reads each corpus's own dir, hf_path and splits (data.corpora[i].dir, ...)")

    def pairs(self) -> list[tuple[str, str]]:
        """Each corpus's (src, tgt) language codes (one pair unless source=corpora)."""
        if self.source != Source.corpora:
            return [(self.src, self.tgt)]
        return [(c.src or self.src, c.tgt or self.tgt) for c in self.corpora]


class LrSchedule(str, Enum):
    """Each schedule reads its own field: noam `train.noam_scale`, inverse_sqrt `train.peak_lr`."""

    noam = "noam"  # Vaswani §5.3: noam_scale * d_model^-0.5 * min(step^-0.5, step * warmup^-1.5)
    inverse_sqrt = "inverse_sqrt"  # linear warm-up to peak_lr, then peak_lr * sqrt(warmup / step)


class BatchBy(str, Enum):
    """The length that training batches are sorted by before they are cut (relmt/data/batching.py)."""

    source = "source"  # source length, then target length (fairseq's order)
    longest = "longest"  # max(source, target + 1): less padding where the two differ (issue 58)


class OutputLoss(str, Enum):
    """train.output_loss: the output layer and the loss over the whole logits, or chunked (issue 58)."""

    auto = "auto"  # chunked at vocabularies of AUTO_CHUNK_VOCAB pieces or more, else whole
    whole = "whole"
    chunked = "chunked"


# On 2 CPU cores the chunked loss trained 1.16x faster at a 32k vocabulary, with a third of the step's peak
# memory (docs/results/performance/loss_memory_cpu.md), and 0.94-1.0x at 8k (train_orders_cpu.md)
AUTO_CHUNK_VOCAB = 16000


class Precision(str, Enum):
    auto = "auto"  # bf16 autocast on CUDA, fp32 on CPU
    fp32 = "fp32"
    bf16 = "bf16"
    fp16 = "fp16"  # with a GradScaler


class BestMetric(str, Enum):
    bleu = "bleu"  # highest validation BLEU
    loss = "loss"  # lowest validation loss


class CheckpointRule(str, Enum):
    """The weights that score the test splits at the end of training (checkpoints/<rule>.pt)."""

    best = "best"  # the best validation figure (train.best_metric)
    last = "last"  # the final update (Shaw §4.1, base model)
    averaged = "averaged"  # the mean of the last train.average_last step checkpoints (Shaw §4.1, big)


@dataclass
class TrainConfig:
    """Optimisation, checkpoints and logging (presets in configs/train/). The defaults form a valid
    config on their own, with the base model's schedule (Shaw §4.1: Noam, scale 2.0, 4000 warm-up
    steps, 100k updates)."""

    # per rank and micro-batch: batch size x (longest source + longest target + 1), padding included;
    # decoding counts source tokens only (decode.*)
    max_padded_tokens: int = 4096
    max_sentences: int = 0  # cap on sentences per micro-batch; 0 = none
    batch_by: BatchBy = BatchBy.source  # the length batches are sorted by: source, or longest side
    update_freq: int = 1  # micro-batches accumulated per update
    max_steps: int = 100_000  # stop after this many updates; 0 = no limit
    max_epochs: int = 0  # stop after this many epochs; 0 = no limit
    lr_schedule: LrSchedule = LrSchedule.noam  # noam or inverse_sqrt; each reads its own field below
    # lr_schedule=noam only: the scale of Vaswani's formula (tensor2tensor's learning_rate_constant);
    # the peak rate it gives is noam_scale * (d_model * warmup_steps)^-0.5, e.g. 1.4e-3 for the base model
    noam_scale: float = 2.0
    peak_lr: float = 1e-3  # lr_schedule=inverse_sqrt only: the learning rate reached at warmup_steps
    warmup_steps: int = 4000  # updates of linear warm-up before the rate decays as step^-0.5
    adam_betas: list[float] = field(default_factory=lambda: [0.9, 0.98])  # Adam's beta1, beta2 (Shaw §4.1: 0.9, 0.98)
    adam_eps: float = 1e-9  # Adam's epsilon (Shaw §4.1: 1e-9)
    weight_decay: float = 0.0  # L2 penalty added to the gradient (torch.optim.Adam's); 0 = off
    # parameters kept at their initial values: fnmatch patterns on parameter names, e.g. '*.rel.w_v'
    # (the a^V tables; an ablation of issue 12). Each pattern must match some parameter.
    freeze: list[str] = field(default_factory=list)
    label_smoothing: float = 0.1  # label smoothing epsilon of the cross-entropy (Shaw §4.1: 0.1)
    clip_norm: float = 0.0  # gradient-norm clipping; 0 = off (tensor2tensor's default)
    # how the tied output layer and the loss are computed: whole (the batch's logits at once), chunked (a few
    # hundred target tokens at a time, gradients included: relmt/train/loss.py output_nll; the same loss and
    # gradients up to float rounding), or auto: chunked at vocabularies of AUTO_CHUNK_VOCAB pieces or more
    output_loss: OutputLoss = OutputLoss.auto
    precision: Precision = Precision.auto  # auto | fp32 | bf16 | fp16 (see Precision)
    # torch.compile the model's forward and backward for training, with symbolic sizes: one graph serves
    # every batch shape (relmt/train/step.py, compile_for_training)
    compile: bool = False
    # round each training batch's source and target lengths up to a multiple of this many tokens; 0 = off.
    # The added positions are padding: masked out of attention and left out of the loss, so an update is
    # the same up to float summation order (with dropout on, its masks are drawn over the padded shape).
    # 8 keeps bf16 matrix shapes aligned to a GPU's tensor cores; max_padded_tokens counts the unrounded
    # lengths, so a batch holds the same sentences either way
    pad_to_multiple: int = 0
    device: str = "auto"  # auto | cpu | cuda | cuda:N
    eval_every: int = 1000  # validate every N updates (and at the end)
    valid_bleu: bool = True  # decode the validation set for BLEU (else loss only)
    best_metric: BestMetric = BestMetric.bleu  # what picks checkpoints/best.pt and drives patience: bleu or loss
    # early stopping: stop after this many validations in a row without a new best of best_metric
    # (the test splits are then scored as after max_steps); 0 or null = off
    patience: int | None = 0
    save_every: int = 1000  # write checkpoints/step_N.pt and last.pt every N updates
    keep_last: int = 5  # step_N.pt files kept
    log_every: int = 100  # log the training loss, rate and speed every N updates
    progress: bool = True  # a tqdm bar on a terminal
    resume: bool = False  # continue from checkpoints/last.pt of the run directory
    # train again from scratch in a run directory that holds a run, replacing its checkpoints and
    # results (metrics.json, metrics.jsonl, tb/, translations/); without it relmt-train never removes them
    overwrite: bool = False
    # fine-tuning: start from this checkpoint's weights (same model config; another vocabulary keeps the rows
    # of the pieces both hold) with a fresh optimizer, schedule and data position. Only seeds a fresh run: a
    # resumable run directory wins.
    init_from: str | None = None
    max_bad_steps: int = 5  # consecutive NaN/inf losses or gradients tolerated (each update skipped)
    test_checkpoint: CheckpointRule = CheckpointRule.best  # what scores the test splits: best, last or averaged
    average_last: int = 0  # at the end, average the last N step_N.pt into averaged.pt (Shaw §4.1: 20)
    # DDP: how long ranks wait in a collective while rank 0 alone builds a missing data cache,
    # validates or decodes the test sets (NCCL's default, 10 minutes, kills long ones)
    dist_timeout_minutes: int = 60

    @property
    def lr_key(self) -> str:
        """The config key that sets the size of the learning rate under this schedule."""
        return "train.noam_scale" if self.lr_schedule == LrSchedule.noam else "train.peak_lr"

    def __post_init__(self) -> None:
        for name in ("max_padded_tokens", "update_freq", "eval_every", "save_every", "log_every", "warmup_steps",
                     "max_bad_steps", "dist_timeout_minutes"):
            _check(getattr(self, name) >= 1, f"train.{name}", f"must be >= 1, got {getattr(self, name)}")
        for name in ("max_steps", "max_epochs", "max_sentences", "keep_last", "pad_to_multiple"):
            _check(getattr(self, name) >= 0, f"train.{name}", f"must be >= 0, got {getattr(self, name)}")
        _check(self.max_steps > 0 or self.max_epochs > 0, "train.max_steps",
               "set train.max_steps or train.max_epochs (both are 0, so training would never stop)")
        _check(self.noam_scale > 0, "train.noam_scale", f"must be > 0, got {self.noam_scale}")
        _check(self.peak_lr > 0, "train.peak_lr", f"must be > 0, got {self.peak_lr}")
        _check(0 <= self.label_smoothing < 1, "train.label_smoothing", "must be in [0, 1)")
        _check(len(self.adam_betas) == 2 and all(0 <= b < 1 for b in self.adam_betas), "train.adam_betas",
               f"must be two numbers in [0, 1), got {list(self.adam_betas)}")
        _check(0 <= self.average_last <= self.keep_last or self.average_last == 0, "train.average_last",
               f"averaging the last {self.average_last} checkpoints needs train.keep_last >= it ({self.keep_last})")
        _check(self.test_checkpoint != CheckpointRule.averaged or self.average_last > 0, "train.test_checkpoint",
               "averaged needs train.average_last > 0")
        _check(self.patience is None or self.patience >= 0, "train.patience",
               f"must be >= 0 (0 or null = off), got {self.patience}")


class EosCandidates(str, Enum):
    """Which of a beam step's 2K best candidates may end a hypothesis with EOS (relmt/decode/beam.py)."""

    t2t = "t2t"  # any of the 2K (tensor2tensor, the code of Shaw et al.)
    fairseq = "fairseq"  # only the first K: an EOS ranked K..2K-1 is dropped (fairseq)


class LengthNorm(str, Enum):
    """How a finished hypothesis's log-probability is normalised by its length |y| (EOS counted), with
    exponent decode.lenpen (relmt/decode/beam.py)."""

    gnmt = "gnmt"  # divided by ((5 + |y|) / 6)^lenpen (Wu et al. 2016; tensor2tensor, the paper's code)
    power = "power"  # divided by |y|^lenpen (fairseq's --lenpen, CTranslate2, Marian)


@dataclass
class DecodeConfig:
    """Decoding for validation BLEU and translation (presets in configs/decode/)."""

    beam: int = 4  # 1 = greedy
    lenpen: float = 0.6  # length penalty alpha: scores are divided by ((5 + |y|) / 6)^alpha (length_norm)
    length_norm: LengthNorm = LengthNorm.gnmt  # gnmt, or power: |y|^alpha (fairseq, CTranslate2)
    # A hypothesis has at most floor(a * |x| + b) tokens, |x| the source's pieces and its EOS: the one rule of
    # validation, the test splits and relmt-translate (relmt/decode/beam.py's max_lengths, which every search
    # calls; relmt/export/decoding.py's for CTranslate2). tensor2tensor's |x| + 50 (a = 1, b = 50) let an
    # untrained model, which rarely ends a sentence, run 50 steps past every source (issue 42). 2|x| + 10
    # truncates no reference of Multi30k's valid and test sets, the toy corpus, or newstest2014 en-de and
    # en-fr (each with its own BPE; references reach 2.7x their source), and halves those steps on the toy
    # corpus (a third fewer on Multi30k). The experiments with committed runs keep a = 1, b = 50.
    max_len_a: float = 2.0
    max_len_b: int = 10  # b of the output length limit floor(a * |x| + b)
    # per decoding batch: batch size x longest source, EOS and padding included (source tokens
    # only; training's train.max_padded_tokens counts source + target)
    max_source_tokens: int = 8000
    max_sentences: int = 0  # cap on sentences per decoding batch (fairseq's --batch-size); 0 = none
    nbest: int = 1  # hypotheses returned per sentence, best first (at most beam)
    early_stop: bool = False  # stop a sentence once it has `beam` finished hypotheses
    min_len: int = 0  # EOS is suppressed before this many output tokens (benchmarks force lengths)
    eos_candidates: EosCandidates = EosCandidates.t2t  # beam > 1 only: beam 1 is always greedy
    # Longer sources are cut to their first max_source_len tokens, with a warning naming the line
    # (0 = no cap). Attention costs grow with the square of the length, and max_len_a/b let the
    # output grow with it; 1024 is 4x the training filter data.max_tokens_per_side (256).
    max_source_len: int = 1024
    # Sampling instead of beam search (relmt/decode/sampling.py): each sentence draws `beam` samples
    # from softmax(logits / temperature), cut to the topk most likely tokens (0 = all) and then to
    # the smallest set holding topp of the probability (1 = all), and returns the nbest of them by
    # score. The draws are a function of (seed, input line, sample, step) alone: no global RNG.
    sampling: bool = False
    topk: int = 0  # sampling only: keep the k most likely tokens; 0 = no cut
    topp: float = 1.0  # sampling only: keep the smallest set holding this probability; 1 = no cut
    temperature: float = 1.0  # sampling only: logits are divided by it (> 0)
    seed: int = 1  # sampling only: draws are a function of (seed, line, sample, step)
    # Word alignments (alignments=true) read the cross-attention of this decoder layer, heads averaged; negative
    # counts from the top (-1: the last). The default, the penultimate, aligned best on the toy corpus's valid
    # split (docs/results/decoding/alignments.md), as Garg et al. (2019) found for a 6-layer model's.
    alignment_layer: int = -2

    def __post_init__(self) -> None:
        _check(self.beam >= 1, "decode.beam", f"must be >= 1, got {self.beam}")
        # JSON and YAML both spell infinity (1e999, .inf): every float is checked finite, and lenpen is capped
        # where ((5 + |y|) / 6)^alpha and |y|^alpha stay finite for outputs of thousands of tokens (issue 57)
        _check(0 <= self.lenpen <= MAX_LENPEN, "decode.lenpen", f"must be in [0, {MAX_LENPEN:g}] (larger "
               f"penalties overflow on long outputs), got {self.lenpen}")
        _check(0 <= self.max_len_a < float("inf"), "decode.max_len_a", f"must be >= 0 and finite, got {self.max_len_a}")
        _check(self.max_len_b >= 0, "decode.max_len_b", f"must be >= 0, got {self.max_len_b}")
        _check(self.max_len_a > 0 or self.max_len_b > 0, "decode.max_len_b", "max_len_a and b are both 0")
        _check(self.max_source_tokens >= 1, "decode.max_source_tokens", f"must be >= 1, got {self.max_source_tokens}")
        _check(self.max_sentences >= 0, "decode.max_sentences", f"must be >= 0 (0 = no cap), got {self.max_sentences}")
        _check(1 <= self.nbest <= self.beam, "decode.nbest", f"must be in [1, beam={self.beam}], got {self.nbest}")
        _check(self.min_len >= 0, "decode.min_len", f"must be >= 0, got {self.min_len}")
        _check(self.max_source_len >= 0, "decode.max_source_len",
               f"must be >= 0 (0 = no cap), got {self.max_source_len}")
        _check(self.topk >= 0, "decode.topk", f"must be >= 0 (0 = no cut), got {self.topk}")
        _check(0 < self.topp <= 1, "decode.topp", f"must be in (0, 1] (1 = no cut), got {self.topp}")
        _check(0 < self.temperature < float("inf"), "decode.temperature",
               f"must be > 0 and finite, got {self.temperature}")
        for name, off in (("topk", 0), ("topp", 1.0), ("temperature", 1.0)):  # a setting that would do nothing
            _check(self.sampling or getattr(self, name) == off, f"decode.{name}",
                   f"applies only when sampling (decode.sampling=true), got {getattr(self, name)} without it")


def upgrade_decode_config(values: dict) -> dict:
    """`to_dict` output saved before decode.max_tokens became decode.max_source_tokens (issue 13),
    with the new name, so that an older checkpoint still translates. Other values come back as they were."""
    decode = values.get("decode")
    if not isinstance(decode, dict) or "max_tokens" not in decode:
        return values
    decode = dict(decode)
    decode["max_source_tokens"] = decode.pop("max_tokens")
    return {**values, "decode": decode}


@dataclass
class Config:
    """The root of a composed run configuration."""

    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    decode: DecodeConfig = field(default_factory=DecodeConfig)
    seed: int = 1  # torch's seed for the initial weights, dropout and batch order
    out_dir: str = ""  # the run directory; the CLI sets it to Hydra's output dir
    # torch CPU threads, as relmt-translate's and relmt-serve's threads=; 0 = the cores free at start
    # (relmt.runtime.choose_threads: all of them on a quiet machine, fewer beside other processes)
    threads: int = 0

    def __post_init__(self) -> None:
        _check(self.threads >= 0, "threads", f"must be >= 0 (0: the cores free at start), got {self.threads}")


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
    """A composed DictConfig -> typed `Config`, running every `__post_init__` check. A key left at ???
    is a ValueError in plain words, as the checks' are (OmegaConf's names the schema class)."""
    from omegaconf import OmegaConf
    from omegaconf.errors import MissingMandatoryValue

    try:
        return OmegaConf.to_object(cfg)
    except MissingMandatoryValue as e:
        raise ValueError(f"{e.full_key}: is required (the config leaves it at ???): give it on the command "
                         f"line, e.g. {e.full_key}=VALUE") from None


def to_dict(cfg: Any) -> dict:
    """A config dataclass as plain JSON-able values (enums become their strings)."""
    def plain(v: Any) -> Any:
        if isinstance(v, Enum):
            return v.value
        if isinstance(v, dict):
            return {k: plain(x) for k, x in v.items()}
        if isinstance(v, (list, tuple)):
            return [plain(x) for x in v]
        return v

    return plain(asdict(cfg))


# Keys renamed since runs were first saved (old -> new), for the message that a command line or
# file still using an old name gets; `upgrade_config` reads a saved config's old names.
RENAMED_KEYS = {
    "train.lr": "train.noam_scale under lr_schedule=noam, train.peak_lr under lr_schedule=inverse_sqrt",
    "train.max_tokens": "train.max_padded_tokens",
    "decode.max_tokens": "decode.max_source_tokens",
    "train.num_threads": "threads (one name for every command: relmt-train, relmt-translate and relmt-serve)",
}


def upgrade_config(values: dict) -> dict:
    """`to_dict` output saved before train keys were renamed (issue 13), with the new names: so an
    older checkpoint still resumes and translates. train.lr meant two things; the saved
    lr_schedule says which (noam: train.noam_scale, inverse_sqrt: train.peak_lr), and
    train.max_tokens is train.max_padded_tokens. Other values come back as they were."""
    train = values.get("train")
    if not isinstance(train, dict) or not {"lr", "max_tokens", "num_threads"} & train.keys():
        return values
    train = dict(train)
    if "num_threads" in train:  # issue 74: one name, threads, for every command
        values = {"threads": train.pop("num_threads"), **values}
    if "lr" in train:  # the old schema's default schedule was noam
        noam = LrSchedule(train.get("lr_schedule", LrSchedule.noam)) == LrSchedule.noam
        train["noam_scale" if noam else "peak_lr"] = train.pop("lr")
    if "max_tokens" in train:
        train["max_padded_tokens"] = train.pop("max_tokens")
    return {**values, "train": train}


def from_dict(values: dict) -> Config:
    """Rebuild a validated `Config` from `to_dict` output (e.g. the one stored in a checkpoint)."""
    from omegaconf import OmegaConf

    return OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(Config),
                                                  upgrade_config(upgrade_decode_config(values))))


def compose(overrides: list[str] | None = None, config_name: str = "config") -> Config:
    """Compose configs/ with Hydra overrides outside a Hydra app (tests, notebooks, scripts)."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    register_configs()
    with initialize_config_dir(str(config_dir()), version_base=None):
        return to_config(hydra_compose(config_name, overrides=overrides or []))
