"""A relmt checkpoint as a CTranslate2 model directory (`relmt-export format=ctranslate2`).

    from relmt.export.ctranslate2 import export
    export("runs/.../checkpoints/best.pt", "ct2_model", quantization="int8")

The directory holds CTranslate2's model.bin, config.json and shared_vocabulary.json (the
sentencepiece pieces in id order), and beside them sentencepiece.model (the checkpoint's own) and
relmt_export.json (what was exported, from where, with which settings, the checkpoint's decode
config among them: relmt.export.decoding.translate_options turns it into CTranslate2's options).

How the relmt model maps onto CTranslate2's TransformerSpec:
- embeddings are multiplied by sqrt(d_model) in every position mode (CT2's scale_embeddings), and
  the output projection is the target embedding (Vaswani §3.4), without a bias;
- absolute encodings (Vaswani §3.5) are relmt's own values, sin and cos interleaved, exported as a
  table of `max_positions` rows: CT2's built-in sinusoids are laid out differently;
- attention: W^Q, W^K, W^V become one fused linear with biases b^Q, 0, b^V (relmt has no key bias);
  CT2 scales q by 1/sqrt(d_head) before both q·k_j and q·a^K_ij, as Shaw eq. (4) does;
- Shaw §3 relative tables go into encoder and decoder self-attention only (never cross-attention),
  as relative_position_keys and relative_position_values, (2k+1, d_head) each, one pair per layer and
  shared by all heads: CT2 has no per-head tables, so a model trained with
  model.relative_share_heads=false (the paper's base model) cannot be exported. With a^K only there
  is no value table (CT2 skips the value term); with a^V only the key table is zero, since CT2 reads
  k from the key table's 2k+1 rows;
- positions=both: CT2 adds absolute encodings only when the first layer's self-attention has no
  relative table, so each stack starts with an extra layer whose output is its input (below);
- pre-norm stacks end in their final LayerNorm, post-norm stacks do not; LayerNorm epsilon is 1e-5
  (torch's default, which relmt uses);
- sources end in </s> (add_source_eos: CT2 appends it) and decoding starts from <s>, relmt's BOS.

Decoding differences that remain (tests/test_export.py measures the rest to float32 rounding):
CT2's length_penalty divides a score by |y|^alpha, as relmt's decode.length_norm=power does (the default,
gnmt, divides by ((5 + |y|) / 6)^alpha), and CT2 lets only an EOS among the first K candidates finish (relmt's
decode.eos_candidates=fairseq; the paper's t2t rule is relmt's default). relmt takes <pad> and <s>
out of the candidates after the softmax, and EOS before decode.min_len; CT2 can only mask logits
before the softmax (min_decoding_length, suppress_sequences), which renormalises. The export leaves
<pad> and <s> unmasked, so scores are relmt's own; a trained model gives them no probability.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

import ctranslate2
import numpy as np
import torch
from ctranslate2.converters.converter import Converter
from ctranslate2.specs import attention_spec, common_spec, transformer_spec
from ctranslate2.specs.model_spec import ACCEPTED_MODEL_TYPES, OPTIONAL
from torch import Tensor, nn

from relmt import checkpoint
from relmt.config import Config, ModelConfig, from_dict, to_dict
from relmt.data.tokenizer import BOS_ID, EOS_ID, PAD_ID, UNK_ID, Tokenizer
from relmt.errors import UserError
from relmt.export.decoding import INFO_FILE
from relmt.model.attention import MultiHeadAttention
from relmt.model.positions import Rotary, T5Bias, sinusoidal_encoding
from relmt.model.transformer import DecoderLayer, EncoderLayer, FeedForward, Transformer, build_model

QUANTIZATIONS = ACCEPTED_MODEL_TYPES
SPM_FILE = "sentencepiece.model"
# Part of the key of every engine=ctranslate2 artefact (relmt/export/engines.py: `dependencies`). Bump it
# whenever a change to this file changes the model directory it writes, so older conversions get rebuilt.
CONVERTER_VERSION = 1


PER_HEAD = ("model.relative_share_heads=false: this model has one a^K/a^V table per attention head "
            "({heads} heads; the paper's base model, Shaw §4.1), and CTranslate2 holds one (2k+1, d_head) "
            "table per layer shared by all heads, so it cannot be exported. Train with "
            "model.relative_share_heads=true (the paper's big-model setting) to export a relative model")


# Position methods beyond the paper that this exporter does not write (issue 31 §4), and why.
# rope goes in as rotary_dim = d_head, rotary_interleave true (neighbouring pairs, as relmt's), base
# 10000; t5 as each layer's relative_attention_bias (the stack's one table) with max distance 128.
NOT_EXPORTED = {
    "alibi": "CTranslate2's TransformerEncoderSpec has no ALiBi (only its decoder spec does), so an "
             "encoder-decoder with ALiBi in the encoder cannot be held",
}


def check_exportable(cfg: ModelConfig) -> None:
    """Raise a UserError naming the setting that CTranslate2 cannot represent, before any weights
    are read (`model_spec` checks the modules themselves too)."""
    has_tables = cfg.positions.relative and (cfg.relative_keys or cfg.relative_values)
    if has_tables and not cfg.relative_share_heads and cfg.n_heads > 1:
        raise UserError(PER_HEAD.format(heads=cfg.n_heads))
    if cfg.positions.value in NOT_EXPORTED:
        raise UserError(f"model.positions={cfg.positions.value}: {NOT_EXPORTED[cfg.positions.value]}")


def _np(t: Tensor) -> np.ndarray:
    return t.detach().to("cpu", torch.float32).numpy().copy()


def _set_linear(spec: common_spec.LinearSpec, weight: Tensor, bias: Tensor | None) -> None:
    spec.weight = _np(weight)
    if bias is not None:
        spec.bias = _np(bias)


def _set_norm(spec: common_spec.LayerNormSpec, norm: nn.LayerNorm) -> None:
    spec.gamma, spec.beta = _np(norm.weight), _np(norm.bias)


def _set_attention(spec: attention_spec.MultiHeadAttentionSpec, attn: MultiHeadAttention, norm: nn.LayerNorm,
                   self_attention: bool) -> None:
    """relmt's q_proj, kv_proj (W^K|W^V, no bias), v_bias and out_proj as CT2's linears: one fused
    QKV linear for self-attention, Q and a fused KV for cross-attention."""
    kv_bias = torch.cat((torch.zeros_like(attn.v_bias), attn.v_bias))
    if self_attention:
        _set_linear(spec.linear[0], torch.cat((attn.q_proj.weight, attn.kv_proj.weight)),
                    torch.cat((attn.q_proj.bias, kv_bias)))
    else:
        _set_linear(spec.linear[0], attn.q_proj.weight, attn.q_proj.bias)
        _set_linear(spec.linear[1], attn.kv_proj.weight, kv_bias)
    _set_linear(spec.linear[-1], attn.out_proj.weight, attn.out_proj.bias)
    _set_norm(spec.layer_norm, norm)
    rel = attn.rel
    if rel is None:
        return
    w_k, w_v = rel.w_k, rel.w_v  # (tables, 2k+1, d_head) each, or None
    if (w_k if w_k is not None else w_v).shape[0] != 1:
        raise UserError(PER_HEAD.format(heads=attn.n_heads))
    # Shaw eq. (4): e_ij = q_i (k_j + a^K_ij)^T / sqrt(d_z); a zero a^K table adds nothing
    spec.relative_position_keys = _np(w_k[0]) if w_k is not None else np.zeros_like(_np(w_v[0]))
    # Shaw eq. (3): z_i = sum_j alpha_ij (v_j + a^V_ij); without a^V, CT2 skips the term
    spec.relative_position_values = _np(w_v[0]) if w_v is not None else OPTIONAL


def _set_ffn(spec: transformer_spec.FeedForwardSpec, ffn: FeedForward, norm: nn.LayerNorm) -> None:
    _set_norm(spec.layer_norm, norm)
    _set_linear(spec.linear_0, ffn.fc1.weight, ffn.fc1.bias)
    _set_linear(spec.linear_1, ffn.fc2.weight, ffn.fc2.bias)


def _identity_layer(decoder: bool, d_model: int, n_heads: int):
    """A CT2 layer whose output is its input, put first in a positions=both stack.

    CTranslate2 adds position encodings to the embeddings only if the first layer's self-attention
    has no relative table. This layer has none, and in CT2's 'pre_post_layer_norm' form it computes
    x + LN(sublayer(LN(x))) for each sublayer: with every output weight zero, each sublayer gives 0,
    LN(0) = beta = 0, and x passes through exactly. Heads of width 1 and an FFN of width 1 keep its
    cost negligible."""
    if decoder:
        layer = transformer_spec.TransformerDecoderLayerSpec(pre_post_layer_norm=True, head_dim=1,
                                                             external_pre_post_encoder_layers=True)
        attentions = [(layer.self_attention, 3), (layer.attention, 1)]
        norms = [layer.external_pre_encoder_attention_layer_norm, layer.external_post_encoder_attention_layer_norm]
    else:
        layer = transformer_spec.TransformerEncoderLayerSpec(pre_post_layer_norm=True, head_dim=1)
        attentions, norms = [(layer.self_attention, 3)], []
    for attn, in_heads in attentions:  # (3 or 1) * n_heads query(/key/value) outputs of width 1
        attn.linear[0].weight = np.zeros((in_heads * n_heads, d_model), np.float32)
        if len(attn.linear) == 3:
            attn.linear[1].weight = np.zeros((2 * n_heads, d_model), np.float32)
        attn.linear[-1].weight = np.zeros((d_model, n_heads), np.float32)
    layer.ffn.linear_0.weight = np.zeros((1, d_model), np.float32)
    layer.ffn.linear_1.weight = np.zeros((d_model, 1), np.float32)
    for norm in (*norms, layer.input_layer_norm, layer.post_attention_layer_norm,
                 layer.pre_feedforward_layer_norm, layer.post_feedforward_layer_norm):
        norm.gamma, norm.beta = np.ones(d_model, np.float32), np.zeros(d_model, np.float32)
    return layer


def _positions_table(absolute: bool, relative: bool, d_model: int, max_positions: int) -> np.ndarray | None:
    """The encodings CT2 adds to the scaled embeddings, (max_positions, d_model): relmt's sinusoids
    (Vaswani §3.5), zeros when the model has no position information, None when relative only."""
    if absolute:
        return _np(sinusoidal_encoding(torch.arange(max_positions), d_model))
    if relative:
        return None
    return np.zeros((max_positions, d_model), np.float32)  # positions=none, or rel without a^K and a^V


def _stack(spec, layers: list[EncoderLayer] | list[DecoderLayer], absolute: bool, max_positions: int,
           positions: nn.Module | None) -> None:
    """Position encodings and layer specs of one stack (encoder or decoder) of `spec`; `positions` is the
    stack's rope or t5 module."""
    decoder = isinstance(layers[0], DecoderLayer)
    attn = layers[0].self_attn
    relative = attn.rel is not None
    specs = transformer_spec
    layer_spec = specs.TransformerDecoderLayerSpec if decoder else specs.TransformerEncoderLayerSpec
    rope, t5 = isinstance(positions, Rotary), isinstance(positions, T5Bias)
    if positions is not None and not (rope or t5):
        raise UserError(f"{type(positions).__name__}: {NOT_EXPORTED['alibi']}")
    spec.layer = [layer_spec(relative_position=relative, relative_attention_bias=t5, rotary_dim=attn.d_head if rope
                             else None, rotary_interleave=True, rotary_base=positions.base if rope else 10000)
                  for _ in layers]
    if t5:
        for layer_spec_i in spec.layer:  # one table per stack (T5): every layer gets the same one
            layer_spec_i.self_attention.relative_attention_bias = _np(positions.table.weight)  # (buckets, heads)
            layer_spec_i.self_attention.relative_attention_max_distance = np.dtype("int32").type(positions.max_distance)
    table = _positions_table(absolute, relative or positions is not None, attn.n_heads * attn.d_head, max_positions)
    if table is None:
        delattr(spec, "position_encodings")
    else:
        spec.position_encodings.encodings = table
        if relative:  # positions=both
            spec.layer.insert(0, _identity_layer(decoder, attn.n_heads * attn.d_head, attn.n_heads))
    for layer_spec_i, layer in zip(spec.layer[-len(layers):], layers):
        _set_attention(layer_spec_i.self_attention, layer.self_attn, layer.norm1, self_attention=True)
        if decoder:
            _set_attention(layer_spec_i.attention, layer.cross_attn, layer.norm2, self_attention=False)
            _set_ffn(layer_spec_i.ffn, layer.ffn, layer.norm3)
        else:
            _set_ffn(layer_spec_i.ffn, layer.ffn, layer.norm2)


@torch.no_grad()
def model_spec(model: Transformer, pieces: list[str], max_positions: int = 2048) -> transformer_spec.TransformerSpec:
    """The CTranslate2 spec of a relmt model, read off its modules (weights copied to float32
    arrays). `pieces` is the sentencepiece vocabulary in id order; `max_positions` bounds source and
    target lengths where there is an absolute-encoding table (CT2 stops with an error beyond it)."""
    if max_positions < 1:
        raise UserError(f"max_positions={max_positions}: must be >= 1")
    if len(pieces) != model.tgt_embed.num_embeddings:
        raise UserError(f"the vocabulary has {len(pieces)} pieces, the model {model.tgt_embed.num_embeddings} rows")
    first = model.encoder_layers[0]
    pre_norm, n_heads = first.pre_norm, first.self_attn.n_heads
    encoder = transformer_spec.TransformerEncoderSpec(len(model.encoder_layers), n_heads, pre_norm=pre_norm)
    decoder = transformer_spec.TransformerDecoderSpec(len(model.decoder_layers), n_heads, pre_norm=pre_norm)
    encoder.embeddings[0].weight = _np(model.src_embed.weight)
    decoder.embeddings.weight = _np(model.tgt_embed.weight)
    encoder.scale_embeddings = decoder.scale_embeddings = True  # x sqrt(d_model) in every mode (Vaswani §3.4)
    _stack(encoder, list(model.encoder_layers), model.absolute, max_positions, model.encoder_positions)
    _stack(decoder, list(model.decoder_layers), model.absolute, max_positions, model.decoder_positions)
    if pre_norm:
        _set_norm(encoder.layer_norm, model.encoder_norm)
        _set_norm(decoder.layer_norm, model.decoder_norm)
    _set_linear(decoder.projection, model.tgt_embed.weight, None)  # tied (Vaswani §3.4), no bias

    spec = transformer_spec.TransformerSpec(encoder, decoder)
    spec.config.layer_norm_epsilon = 1e-5  # torch.nn.LayerNorm's default
    spec.config.unk_token, spec.config.bos_token, spec.config.eos_token = (pieces[i] for i in (UNK_ID, BOS_ID, EOS_ID))
    spec.config.decoder_start_token = pieces[BOS_ID]  # relmt's decoder input is BOS + y
    spec.config.add_source_eos = True  # relmt's sources end in EOS
    spec.register_source_vocabulary(pieces)
    spec.register_target_vocabulary(pieces)
    return spec


def export_info(path: str | Path, step: int | None, cfg: Config) -> dict:
    """What relmt_export.json records of the checkpoint: where it was, its step, its model and decode config."""
    return {"checkpoint": str(path), "step": step, "model": to_dict(cfg.model), "decode": to_dict(cfg.decode)}


class RelmtConverter(Converter):
    """CTranslate2's converter interface for a relmt model: `convert(output_dir, quantization=...)`
    writes the model directory, with the sentencepiece model (and `info`, as relmt_export.json)
    beside it. `RelmtConverter.from_checkpoint(path)` reads model and vocabulary from a checkpoint."""

    def __init__(self, model: Transformer, tokenizer: Tokenizer, max_positions: int = 2048,
                 info: dict | None = None) -> None:
        self.model, self.tokenizer, self.max_positions = model.eval(), tokenizer, max_positions
        self.info = {"ctranslate2": ctranslate2.__version__, **(info or {})}
        self._tmp: tempfile.TemporaryDirectory | None = None

    @classmethod
    def from_checkpoint(cls, path: str | Path, max_positions: int = 2048) -> RelmtConverter:
        return cls.from_payload(checkpoint.load(path), path, max_positions)

    @classmethod
    def from_payload(cls, ck: dict, path: str | Path, max_positions: int = 2048) -> RelmtConverter:
        """As from_checkpoint, from the checkpoint at `path` already loaded (`ck`)."""
        cfg = from_dict(ck["config"])
        check_exportable(cfg.model)  # before the weights are read into a model
        spm = ck.get("spm") or {}
        if not spm.get("model"):
            raise UserError(f"{path}: the checkpoint holds no sentencepiece model")
        tokenizer = Tokenizer(spm.get("path", SPM_FILE), model=spm["model"])
        model = build_model(cfg.model, tokenizer.vocab_size, PAD_ID)
        checkpoint.load_model_state(model, ck["model"], path)
        return cls(model, tokenizer, max_positions, export_info(path, ck.get("step"), cfg))

    def _load(self) -> transformer_spec.TransformerSpec:
        pieces = [self.tokenizer.sp.id_to_piece(i) for i in range(self.tokenizer.vocab_size)]
        spec = model_spec(self.model, pieces, self.max_positions)
        self._tmp = tempfile.TemporaryDirectory(prefix="relmt-export-")
        tmp = Path(self._tmp.name)
        (tmp / SPM_FILE).write_bytes(self.tokenizer.model_bytes())
        absolute = hasattr(spec.encoder, "position_encodings")
        info = {**self.info, "max_positions": self.max_positions if absolute else None,
                "length_penalty": "CTranslate2 divides a score by length^alpha, relmt by ((5 + length) / 6)^alpha "
                                  "unless decode.length_norm=power"}
        (tmp / INFO_FILE).write_text(json.dumps(info, indent=2) + "\n")
        spec.register_file(str(tmp / SPM_FILE))
        spec.register_file(str(tmp / INFO_FILE))
        return spec

    def convert(self, output_dir: str, vmap: str | None = None, quantization: str | None = None,
                force: bool = False) -> str:
        try:
            return super().convert(output_dir, vmap=vmap, quantization=quantization, force=force)
        finally:
            if self._tmp is not None:
                self._tmp.cleanup()
                self._tmp = None


def export(checkpoint_path: str | Path, output_dir: str | Path, quantization: str | None = None,
           max_positions: int = 2048, force: bool = False) -> Path:
    """Write the CTranslate2 model directory of a checkpoint; returns its path. The directory is
    built beside `output_dir` and moved into place, so a failed export leaves nothing half-written."""
    if quantization is not None and quantization not in QUANTIZATIONS:
        raise UserError(f"quantization={quantization}: must be one of {', '.join(QUANTIZATIONS)}")
    if max_positions < 1:
        raise UserError(f"max_positions={max_positions}: must be >= 1")
    out = Path(output_dir)
    if out.exists() and not force:
        raise UserError(f"output={out}: already exists (give force=true to replace it)")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.tmp")
    if tmp.exists():
        shutil.rmtree(tmp)
    try:
        RelmtConverter.from_checkpoint(checkpoint_path, max_positions).convert(str(tmp), quantization=quantization)
        if out.is_dir():
            shutil.rmtree(out)
        elif out.exists():
            out.unlink()
        os.replace(tmp, out)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp)
    return out
