"""The chunked output layer and loss (relmt/train/loss.py output_nll; issue 58): the same loss, NLL and
gradients as the model's whole logits through label_smoothed_nll, with padding, label smoothing and the
tied embedding (whose gradient gathers the output layer's and the embedding lookups'), pinned in float64
and in the float32 that CPU training uses (oneDNN's products)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from relmt.config import ModelConfig
from relmt.data.batching import Batch
from relmt.data.tokenizer import PAD_ID
from relmt.model.transformer import build_model
from relmt.train import distributed
from relmt.train import step as step_module
from relmt.train.loss import chunk_rows, label_smoothed_nll, output_nll

pytestmark = pytest.mark.usefixtures("cpu_for_auto")  # CPU float32 pins: see conftest.py
VOCAB = 37


def tiny_model(dtype: torch.dtype = torch.float32, seed: int = 0):
    torch.manual_seed(seed)
    cfg = ModelConfig(d_model=16, n_heads=2, d_ff=32, encoder_layers=1, decoder_layers=2, dropout=0.0,
                      attention_dropout=0.0, activation_dropout=0.0)
    return build_model(cfg, VOCAB, PAD_ID).to(dtype)


def padded_batch(seed: int = 1) -> Batch:
    g = torch.Generator().manual_seed(seed)
    src = torch.randint(4, VOCAB, (3, 7), generator=g)
    tgt = torch.randint(4, VOCAB, (3, 9), generator=g)
    src[0, 5:] = PAD_ID
    tgt[1, 4:] = PAD_ID  # padded target rows: no loss, no gradient
    tgt[2, 7:] = PAD_ID
    return Batch(src, tgt[:, :-1], tgt[:, 1:], torch.arange(3))


def grads(model, chunked: bool, epsilon: float, rows: int = 0, scale: float = 1.0):
    model.zero_grad(set_to_none=True)
    batch = padded_batch()
    if chunked:
        loss, nll = output_nll(model(batch.src, batch.tgt_in, project=False), model.tgt_embed.weight,
                               batch.tgt_out, epsilon, rows)
    else:
        loss, nll = label_smoothed_nll(model(batch.src, batch.tgt_in), batch.tgt_out, epsilon)
    (scale * loss).backward()
    return loss.detach(), nll.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}


@pytest.mark.parametrize("epsilon", [0.0, 0.1])
@pytest.mark.parametrize("rows", [1, 5, 0])  # chunks of one row, uneven chunks, one chunk (the default here)
def test_float64_equals_the_whole_logits(float64, epsilon, rows):
    model = tiny_model(torch.float64)
    loss, nll, expected = grads(model, False, epsilon)
    c_loss, c_nll, got = grads(model, True, epsilon, rows)
    torch.testing.assert_close(c_loss, loss, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(c_nll, nll, rtol=1e-12, atol=1e-12)
    # one parameter for the source and target embeddings and the output layer: its gradient sums all three
    assert expected.keys() == got.keys() and model.tgt_embed.weight is model.src_embed.weight
    for name in expected:
        torch.testing.assert_close(got[name], expected[name], rtol=1e-10, atol=1e-12, msg=name)


def test_float32_training_matches_within_float32_rounding():
    """CPU float32, oneDNN's products in both: the gradients agree to float32 rounding of sums."""
    model = tiny_model()
    loss, nll, expected = grads(model, False, 0.1)
    c_loss, c_nll, got = grads(model, True, 0.1, rows=4)
    torch.testing.assert_close(c_loss, loss, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(c_nll, nll, rtol=1e-5, atol=1e-5)
    for name in expected:
        torch.testing.assert_close(got[name], expected[name], rtol=1e-4, atol=1e-5, msg=name)


def test_the_gradient_scales_with_the_losss_and_the_nll_has_none(float64):
    model = tiny_model(torch.float64)
    _, _, once = grads(model, True, 0.1, rows=3)
    _, _, thrice = grads(model, True, 0.1, rows=3, scale=3.0)  # GradScaler's scaled loss, say
    for name in once:
        torch.testing.assert_close(thrice[name], 3.0 * once[name])
    batch = padded_batch()
    _, nll = output_nll(model(batch.src, batch.tgt_in, project=False), model.tgt_embed.weight, batch.tgt_out, 0.1)
    assert not nll.requires_grad


def test_without_gradients_it_only_scores(float64):
    model = tiny_model(torch.float64)
    batch = padded_batch()
    with torch.no_grad():
        loss, nll = output_nll(model(batch.src, batch.tgt_in, project=False), model.tgt_embed.weight,
                               batch.tgt_out, 0.1, rows=2)
        expected = label_smoothed_nll(model(batch.src, batch.tgt_in), batch.tgt_out, 0.1)
    torch.testing.assert_close((loss, nll), expected)
    assert not loss.requires_grad


def test_mixed_precision_products_in_bf16():
    """Under autocast the products run in the autocast dtype and the sums in float32, as the whole logits'
    path does (F.linear in bf16, label_smoothed_nll in float32): the same to bf16 rounding."""
    model = tiny_model()
    batch = padded_batch()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logits = model(batch.src, batch.tgt_in)
        states = model(batch.src, batch.tgt_in, project=False)
    expected, _ = label_smoothed_nll(logits, batch.tgt_out, 0.1)
    loss, _ = output_nll(states, model.tgt_embed.weight, batch.tgt_out, 0.1, rows=4, dtype=torch.bfloat16)
    assert loss.dtype == torch.float32
    torch.testing.assert_close(loss, expected, rtol=2e-2, atol=0)
    loss.backward()
    assert model.tgt_embed.weight.grad.dtype == torch.float32 and model.tgt_embed.weight.grad.isfinite().all()


def test_a_train_step_with_the_chunked_loss_equals_one_without():
    results = []
    for chunked in (False, True):
        model = tiny_model(seed=3)
        optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
        scaler = torch.amp.GradScaler("cpu", enabled=False)
        dist = distributed.Dist(0, 1, torch.device("cpu"))
        figures = step_module.train_step(model, model, optimizer, scaler, [padded_batch(), padded_batch(2)], 1e-2,
                                         0.1, None, dist, chunked_loss=chunked)
        results.append((figures, {n: p.detach().clone() for n, p in model.named_parameters()}))
    (plain, plain_params), (chunked, chunked_params) = results
    assert plain[2:4] == chunked[2:4]  # token counts
    assert chunked[0] == pytest.approx(plain[0], rel=1e-5) and chunked[4] == pytest.approx(plain[4], rel=1e-4)
    for name in plain_params:
        torch.testing.assert_close(chunked_params[name], plain_params[name], rtol=1e-4, atol=1e-5, msg=name)


def test_chunk_rows():
    assert chunk_rows(32000) == 262 and chunk_rows(10 ** 9) == 1 and chunk_rows(8) == 2 ** 20


def test_f_linear_stays_the_reference(float64):
    """The reference path itself: label_smoothed_nll of F.linear equals F.cross_entropy's smoothing."""
    h, w = torch.randn(6, 4), torch.randn(VOCAB, 4)
    t = torch.tensor([5, 6, PAD_ID, 7, 8, 9])
    loss, _ = label_smoothed_nll(F.linear(h, w), t, 0.1)
    expected = F.cross_entropy(F.linear(h, w), t, ignore_index=PAD_ID, label_smoothing=0.1, reduction="sum")
    torch.testing.assert_close(loss, expected)


@pytest.mark.parametrize("setting,expected", [("auto", "whole logits"), ("chunked", "chunked")])
def test_the_trainer_picks_the_route_by_setting_and_vocabulary(tmp_path, caplog, setting, expected):
    """auto chunks at vocabularies of AUTO_CHUNK_VOCAB pieces or more: the toy vocabulary is far below."""
    import logging

    from relmt.config import compose
    from relmt.train.loop import train

    cfg = compose(["model=tiny", "train=debug", "train.max_steps=2", "train.valid_bleu=false", "train.eval_every=2",
                   f"train.output_loss={setting}", f"data.cache_dir={tmp_path / 'cache'}", "data.toy.n_train=200",
                   "data.toy.n_valid=5", "data.toy.n_test=5", "data.toy.n_test_long=5"])
    cfg.out_dir = str(tmp_path / "run")
    with caplog.at_level(logging.INFO):
        metrics = train(cfg)
    assert f"the output layer and loss: {expected} (train.output_loss={setting}" in caplog.text
    assert metrics["status"] == "completed"
