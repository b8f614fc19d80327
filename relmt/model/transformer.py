"""The encoder-decoder Transformer (Vaswani et al. 2017) with Shaw et al. 2018 position options.

`build_model(cfg, vocab_size, pad_id)` is the only place that reads a config; the layers take
flat arguments. Relative tables go into encoder and decoder self-attention only, one set per
layer; cross-attention stays plain (Shaw §3, as in tensor2tensor). The stack-wide methods (rope,
alibi, t5) are one module per stack whose `PositionTerms` the stack computes once per pass and
hands to each layer's self-attention.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from relmt.config import ModelConfig, Norm, PosKind
from relmt.dropout import Dropout
from relmt.model.attention import MultiHeadAttention
from relmt.model.cache import DecoderCache, LayerCache, extend
from relmt.model.linear import Linear, linear
from relmt.model.positions import (
    NO_TERMS,
    ALiBi,
    PositionTerms,
    RelativePositions,
    Rotary,
    T5Bias,
    in_graph,
    sinusoidal_encoding,
)


class FeedForward(nn.Module):
    """Vaswani §3.3: FFN(x) = max(0, x W_1 + b_1) W_2 + b_2."""

    def __init__(self, d_model: int, d_ff: int, dropout: float) -> None:
        super().__init__()
        self.fc1 = Linear(d_model, d_ff)
        self.fc2 = Linear(d_ff, d_model)
        self.dropout = Dropout(dropout)
        for lin in (self.fc1, self.fc2):
            nn.init.xavier_uniform_(lin.weight)
            nn.init.zeros_(lin.bias)

    def forward(self, x: Tensor) -> Tensor:
        return self.fc2(self.dropout(F.relu(self.fc1(x))))


def residual(x: Tensor, y: Tensor, dropout: Dropout, norm: nn.LayerNorm, pre_norm: bool) -> Tensor:
    """x + dropout(y) (Vaswani §5.4), then LayerNorm for post-norm; pre-norm normalised the input."""
    x = x + dropout(y)
    return x if pre_norm else norm(x)


class EncoderLayer(nn.Module):
    """Self-attention (relative when `rel` is given) and FFN, each in a residual block."""

    def __init__(self, d_model: int, n_heads: int, d_ff: int, dropout: float, attention_dropout: float,
                 activation_dropout: float, pre_norm: bool, rel: RelativePositions | None) -> None:
        super().__init__()
        self.self_attn = MultiHeadAttention(d_model, n_heads, attention_dropout, rel)
        self.ffn = FeedForward(d_model, d_ff, activation_dropout)
        self.norm1 = nn.LayerNorm(d_model)
        self.norm2 = nn.LayerNorm(d_model)
        self.dropout = Dropout(dropout)
        self.pre_norm = pre_norm

    def forward(self, x: Tensor, mask: Tensor, terms: PositionTerms = NO_TERMS) -> Tensor:
        """x: (B, S, d_model); mask: (B, 1, 1, S) keep-mask; terms: the stack's positions."""
        h = self.norm1(x) if self.pre_norm else x
        y = self.self_attn(h, *self.self_attn.project_kv(h, terms), mask=mask, terms=terms)
        x = residual(x, y, self.dropout, self.norm1, self.pre_norm)
        h = self.norm2(x) if self.pre_norm else x
        return residual(x, self.ffn(h), self.dropout, self.norm2, self.pre_norm)


class DecoderLayer(nn.Module):
    """Causal self-attention (relative when `rel` is given), plain cross-attention, FFN."""

    def __init__(self, d_model: int, n_heads: int, d_ff: int, dropout: float, attention_dropout: float,
                 activation_dropout: float, pre_norm: bool, rel: RelativePositions | None) -> None:
        super().__init__()
        self.self_attn = MultiHeadAttention(d_model, n_heads, attention_dropout, rel)
        self.cross_attn = MultiHeadAttention(d_model, n_heads, attention_dropout, rel=None)
        self.ffn = FeedForward(d_model, d_ff, activation_dropout)
        self.norm1 = nn.LayerNorm(d_model)
        self.norm2 = nn.LayerNorm(d_model)
        self.norm3 = nn.LayerNorm(d_model)
        self.dropout = Dropout(dropout)
        self.pre_norm = pre_norm

    def forward(self, x: Tensor, cross_k: Tensor, cross_v: Tensor, src_mask: Tensor,
                past: tuple[Tensor, Tensor] | None = None, past_order: Tensor | None = None,
                terms: PositionTerms = NO_TERMS, self_mask: Tensor | None = None,
                ) -> tuple[Tensor, tuple[Tensor, Tensor]]:
        """x: (B*K, n, d_model), the target positions after the `past` ones (keys/values of the
        earlier positions, (B*K, H, t, D) each, or None for a full teacher-forced pass) of K
        hypotheses per source; past_order picks the past row of each hypothesis (None: row b);
        cross_k, cross_v: (B, H, S, D); src_mask: (B, 1, 1, S); terms: the stack's positions;
        self_mask: (B*K, 1, 1, t + n) keep-mask over the self-attention keys (None: all of them).
        Returns the layer output and the self-attention keys/values of all t + n positions."""
        offset = 0 if past is None else past[0].shape[2]
        h = self.norm1(x) if self.pre_norm else x
        q, step = None, past is not None and in_graph()  # a compiled decoder step
        if step:
            q, k, v = self.self_attn.project_qkv(h, terms)  # a compiled step: one GEMM (B, H, n, D) each
        else:
            k, v = self.self_attn.project_kv(h, terms)  # (B, H, n, D)
        if past is not None:
            k, v = extend(past[0], k, past_order), extend(past[1], v, past_order)
        y = self.self_attn(h, k, v, mask=self_mask, causal=True, q_offset=offset, terms=terms, q=q, written=step)
        x = residual(x, y, self.dropout, self.norm1, self.pre_norm)
        h = self.norm2(x) if self.pre_norm else x
        # Cross-attention has no positions (Shaw §3), so the K hypotheses of one sentence (rows
        # grouped by sentence when cross_k has B rows and x has B*K) are K*n queries against one
        # copy of that sentence's keys; beam search never repeats or reorders the source.
        y = self.cross_attn(h.reshape(cross_k.shape[0], -1, h.shape[-1]), cross_k, cross_v, mask=src_mask,
                            written=step)
        y = y.view_as(h)
        x = residual(x, y, self.dropout, self.norm2, self.pre_norm)
        h = self.norm3(x) if self.pre_norm else x
        x = residual(x, self.ffn(h), self.dropout, self.norm3, self.pre_norm)
        return x, (k, v)


class Transformer(nn.Module):
    """Encoder-decoder with the output projection tied to the target embedding (Vaswani §3.4)."""

    def __init__(self, src_embed: nn.Embedding, tgt_embed: nn.Embedding,
                 encoder_layers: list[EncoderLayer], decoder_layers: list[DecoderLayer],
                 dropout: float, absolute: bool, pre_norm: bool, pad_id: int,
                 encoder_positions: nn.Module | None = None, decoder_positions: nn.Module | None = None) -> None:
        super().__init__()
        self.src_embed = src_embed
        self.tgt_embed = tgt_embed
        self.encoder_layers = nn.ModuleList(encoder_layers)
        self.decoder_layers = nn.ModuleList(decoder_layers)
        d_model = tgt_embed.embedding_dim
        # Pre-norm stacks end in a LayerNorm; post-norm layers already normalise their output.
        self.encoder_norm = nn.LayerNorm(d_model) if pre_norm else nn.Identity()
        self.decoder_norm = nn.LayerNorm(d_model) if pre_norm else nn.Identity()
        self.embed_dropout = Dropout(dropout)
        self.embed_scale = math.sqrt(d_model)
        self.absolute = absolute
        self.pad_id = pad_id
        # rope, alibi or t5: one per stack (relmt.model.positions), giving terms(n, m, q_offset, ...)
        self.encoder_positions = encoder_positions
        self.decoder_positions = decoder_positions
        self.out_layer: Linear | None = None  # export only (`freeze_projections`): the tied output layer's copy

    @staticmethod
    def _terms(positions: nn.Module | None, n: int, m: int, q_offset: int, like: Tensor) -> PositionTerms:
        return NO_TERMS if positions is None else positions.terms(n, m, q_offset, like.device, like.dtype)

    def _embed(self, embed: nn.Embedding, tokens: Tensor, offset: int | Tensor = 0) -> Tensor:
        """tokens: (B, T) -> (B, T, d_model). The sqrt(d_model) scale and the dropout apply in
        every position mode (OpenNMT-py once lost both when positions were off). offset: the first
        position, or (B,) one per row."""
        x = embed(tokens) * self.embed_scale
        if self.absolute:  # Vaswani §3.5; positions offset..offset+T-1
            if isinstance(offset, Tensor):
                pos = offset[:, None] + torch.arange(tokens.shape[1], device=tokens.device)  # (B, T)
                pe = sinusoidal_encoding(pos.reshape(-1), x.shape[-1]).view(*pos.shape, -1)
            else:
                pe = sinusoidal_encoding(torch.arange(offset, offset + tokens.shape[1], device=tokens.device),
                                         x.shape[-1])
            x = x + pe.to(x.dtype)
        return self.embed_dropout(x)

    def encode(self, src: Tensor) -> tuple[Tensor, Tensor]:
        """src: (B, S) token ids, right-padded. Returns memory (B, S, d_model) and the source
        keep-mask (B, S), True at real tokens."""
        src_mask = src != self.pad_id
        mask = src_mask[:, None, None, :]  # (B, 1, 1, S)
        x = self._embed(self.src_embed, src)
        terms = self._terms(self.encoder_positions, src.shape[1], src.shape[1], 0, x)
        for layer in self.encoder_layers:
            x = layer(x, mask, terms)
        return self.encoder_norm(x), src_mask

    def _logits(self, x: Tensor) -> Tensor:
        """x: (B, T, d_model) -> (B, T, V) scores over the vocabulary: the output projection is the
        target embedding matrix itself (Vaswani §3.4, tied weights), or an exported copy's module of it."""
        if self.out_layer is not None:
            return self.out_layer(self.decoder_norm(x))
        return linear(self.decoder_norm(x), self.tgt_embed.weight)

    def freeze_projections(self) -> None:
        """For an exported copy whose linear maps become modules of another kind (int8, relmt/export/quantize.py):
        every attention's computed projections as modules (MultiHeadAttention.freeze_projections), and the tied
        output layer as a Linear of its own (a copy of the embedding). Never on a model that trains. A model frozen
        already stays as it is (an int8 copy, whose frozen maps are int8 modules: relmt.export.graphs.LoopGraph)."""
        if any(isinstance(m, MultiHeadAttention) and m.frozen is not None for m in self.modules()):
            return
        for module in self.modules():
            if isinstance(module, MultiHeadAttention):
                module.freeze_projections()
        w = self.tgt_embed.weight.detach()
        self.out_layer = Linear(w.shape[1], w.shape[0], bias=False)
        self.out_layer.weight = nn.Parameter(w.clone())

    def decode(self, tgt_in: Tensor, memory: Tensor, src_mask: Tensor, project: bool = True) -> Tensor:
        """Teacher-forced pass. tgt_in: (B*K, T) = BOS + y, right-padded, K >= 1 hypotheses per
        sentence of memory (B, S, d_model) and src_mask (B, S). Returns (B*K, T, V) logits, or with
        project=False the normalised states (B*K, T, d_model) that the output layer would multiply by
        tgt_embed.weight (the chunked loss of relmt/train/loss.py does it a few rows at a time)."""
        mask = src_mask[:, None, None, :]
        x = self._embed(self.tgt_embed, tgt_in)
        terms = self._terms(self.decoder_positions, tgt_in.shape[1], tgt_in.shape[1], 0, x)
        for layer in self.decoder_layers:
            k, v = layer.cross_attn.project_kv(memory)
            x, _ = layer(x, k, v, mask, terms=terms)
        return self._logits(x) if project else self.decoder_norm(x)

    def forward(self, src: Tensor, tgt_in: Tensor, project: bool = True) -> Tensor:
        memory, src_mask = self.encode(src)
        return self.decode(tgt_in, memory, src_mask, project)

    def init_cache(self, memory: Tensor, hypotheses: int | None = None) -> DecoderCache:
        """An empty cache for `hypotheses` rows (default: one per sentence; K per sentence for a
        beam of K), holding each layer's cross-attention keys/values of `memory` once."""
        layers = []
        for layer in self.decoder_layers:
            ck, cv = layer.cross_attn.project_kv(memory)  # (B, H, S, D)
            empty = ck.new_zeros(hypotheses or ck.shape[0], ck.shape[1], 0, ck.shape[3])
            layers.append(LayerCache(empty, empty, ck, cv))
        return DecoderCache(tuple(layers))

    def decode_step(self, tokens: Tensor, memory: Tensor, src_mask: Tensor,
                    cache: DecoderCache | None = None, step: int = 0, out_weight: Tensor | None = None,
                    starts: Tensor | None = None) -> tuple[Tensor, DecoderCache]:
        """One incremental step. tokens: (B*K,) the token at target position `step` of K >= 1
        hypotheses per sentence of memory (B, S, d_model); cache holds positions 0..step-1 (None
        at step 0). Returns (B*K, V) logits for position step+1 and the cache extended by this
        position. The relative term uses the row of distances j - step.

        out_weight: (V', d_model), V' >= V, the tied embedding with zero rows appended, which a
        decoder prepares once to make the output GEMM faster (relmt.decode.search.output_weight);
        the scores of the appended rows are cut off, so the logits are those of `_logits`.

        starts: (B*K,) the cache slot where each row's sentence began (its BOS), for rows that joined a
        running search later (relmt/decode/continuous.py); None: all at slot 0. A row's slots before its
        start are padding, masked out of self-attention, and its position at slot `step` is step - start.
        Only the absolute encoding reads positions: the relative terms (Shaw §3), ALiBi and T5 see the
        distance between two slots, the same as between their positions. RoPE rotates by the slot, so a
        cache of rotated keys must keep its slots (continuous.py never shifts one)."""
        if tokens.shape[0] % memory.shape[0]:
            raise ValueError(f"decode_step: {tokens.shape[0]} hypotheses for {memory.shape[0]} sentences")
        if cache is None:
            cache = self.init_cache(memory, tokens.shape[0])
        if cache.length != step:
            raise ValueError(f"decode_step(step={step}) got a cache holding {cache.length} positions")
        if cache.batch_size != tokens.shape[0]:
            raise ValueError(f"decode_step: {tokens.shape[0]} tokens for a cache of {cache.batch_size} hypotheses")
        mask = src_mask[:, None, None, :]
        self_mask = None
        if starts is not None:
            self_mask = (torch.arange(step + 1, device=tokens.device) >= starts[:, None])[:, None, None, :]
        x = self._embed(self.tgt_embed, tokens[:, None], offset=step if starts is None else step - starts)
        terms = self._terms(self.decoder_positions, 1, step + 1, step, x)
        layers = []
        for layer, lc in zip(self.decoder_layers, cache.layers):
            x, (k, v) = layer(x, lc.cross_k, lc.cross_v, mask, (lc.self_k, lc.self_v), cache.order, terms,
                              self_mask)
            layers.append(LayerCache(k, v, lc.cross_k, lc.cross_v))
        if out_weight is None or self.out_layer is not None:  # an exported copy multiplies by its own module
            logits = self._logits(x)[:, 0]
        else:
            logits = linear(self.decoder_norm(x), out_weight)[:, 0, : self.tgt_embed.num_embeddings]
        return logits, DecoderCache(tuple(layers))


def build_model(cfg: ModelConfig, vocab_size: int, pad_id: int) -> Transformer:
    """The one place where a `ModelConfig` becomes modules."""
    d_head = cfg.d_model // cfg.n_heads

    def rel() -> RelativePositions | None:
        # One table set per layer (Shaw §3.2); none when positions are not relative or when both
        # a^K and a^V are switched off (Table 3's last row equals no position information).
        if not cfg.positions.relative or not (cfg.relative_keys or cfg.relative_values):
            return None
        return RelativePositions(cfg.n_heads, d_head, cfg.max_relative_position, cfg.relative_keys,
                                 cfg.relative_values, cfg.relative_share_heads)

    def stack_positions(causal: bool) -> nn.Module | None:
        # rope, alibi, t5: self-attention of one stack, never cross-attention (as for Shaw, §3)
        if cfg.positions == PosKind.rope:
            return Rotary(d_head)
        if cfg.positions == PosKind.alibi:
            return ALiBi(cfg.n_heads)
        if cfg.positions == PosKind.t5:  # 32 buckets up to distance 128, T5's; causal in the decoder
            return T5Bias(cfg.n_heads, cfg.d_model, bidirectional=not causal)
        return None

    def embedding() -> nn.Embedding:
        emb = nn.Embedding(vocab_size, cfg.d_model, padding_idx=pad_id)
        nn.init.normal_(emb.weight, std=cfg.d_model ** -0.5)
        with torch.no_grad():
            emb.weight[pad_id].zero_()
        return emb

    pre_norm = cfg.norm == Norm.pre
    layer_args = (cfg.d_model, cfg.n_heads, cfg.d_ff, cfg.dropout, cfg.attention_dropout,
                  cfg.activation_dropout, pre_norm)
    tgt_embed = embedding()
    src_embed = tgt_embed if cfg.share_embeddings else embedding()
    return Transformer(
        src_embed, tgt_embed,
        [EncoderLayer(*layer_args, rel()) for _ in range(cfg.encoder_layers)],
        [DecoderLayer(*layer_args, rel()) for _ in range(cfg.decoder_layers)],
        cfg.dropout, cfg.positions.absolute, pre_norm, pad_id, stack_positions(False), stack_positions(True),
    )
