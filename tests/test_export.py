"""relmt-export format=ctranslate2: the exported model decodes as relmt's own beam search does.

Random models of every position mode and norm (rope and t5 too; alibi is refused), and a model
trained for a few hundred updates, are exported and decoded by ctranslate2.Translator at beam 4;
tokens must equal relmt's and scores agree to float32 rounding. Two settings differ by design and
are matched here (relmt/export/ctranslate2.py says why): CT2 lets only an EOS among the first K
candidates finish, which is relmt's decode.eos_candidates=fairseq, and its length penalty is
|y|^alpha where relmt's is ((5 + |y|) / 6)^alpha, so forced-length scores are compared as log-
probabilities, and free-running decoding (where the penalty picks among lengths) runs with alpha =
0.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import ctranslate2
import numpy as np
import pytest
import sentencepiece as spm
import torch

from relmt import checkpoint
from relmt.cli.common import guarded
from relmt.cli.export import _export
from relmt.config import Config, DecodeConfig, EosCandidates, LengthNorm, ModelConfig, Norm, PosKind, to_dict
from relmt.data.tokenizer import BOS_ID, EOS_ID, PAD_ID, Tokenizer, train_tokenizer
from relmt.decode.translator import Translator
from relmt.errors import UserError
from relmt.export.ctranslate2 import export
from relmt.export.decoding import translate_options
from relmt.model.transformer import Transformer, build_model
from tests.tiny_checkpoints import TOY, shared_tiny

WORDS = ("the a my dog cat bird king frog saw chased found ran slept big small red old near river house "
         "alice bob carol and because that quickly said").split()
SENTENCES = ["the dog saw the cat", "a small red bird slept", "alice said that bob ran",
             "the old king near the river chased my frog", "bob ran", "carol quickly found a big house because "
             "the cat slept near the small red house"]
BEAM, ALPHA, FORCED = 4, 0.6, 7


@pytest.fixture(scope="module")
def spm_model(tmp_path_factory) -> Path:
    rnd = random.Random(0)
    lines = [" ".join(rnd.choice(WORDS) for _ in range(rnd.randint(1, 10))) for _ in range(400)]
    path = tmp_path_factory.mktemp("spm") / "spm.model"
    train_tokenizer(lines, path, vocab_size=64, model_type="word")
    return path


def without_special_tokens(model: Transformer) -> None:
    """Give <pad>, <s> and </s> no probability, as training does, in a random model.

    relmt's search drops <pad> and <s> from the candidates after the softmax (and EOS before
    min_len); CT2 can only mask logits before it, which renormalises the rest. The two agree when
    those tokens carry no probability mass. A random model gives them some, so column 0 of the
    tied embedding and the final LayerNorm's unit 0 (gain 0, bias 1000) add a constant logit:
    +20 to every ordinary token, 0 to <pad> (its row stays zero) and -20 to <s> and </s>.
    The input embeddings change by at most 0.02 in one of 32 units."""
    final = model.decoder_norm if isinstance(model.decoder_norm, torch.nn.LayerNorm) else model.decoder_layers[-1].norm3
    with torch.no_grad():
        final.weight[0], final.bias[0] = 0.0, 1000.0
        column = torch.full((model.tgt_embed.num_embeddings,), 0.02)
        column[[BOS_ID, EOS_ID]], column[PAD_ID] = -0.02, 0.0
        model.tgt_embed.weight[:, 0] = column


def random_checkpoint(directory: Path, spm_path: Path, decode: DecodeConfig | None = None, **fields) -> Path:
    """A checkpoint of a random small model (seeded), as training would save it."""
    cfg = Config(model=ModelConfig(**{"d_model": 32, "n_heads": 4, "d_ff": 64, "encoder_layers": 2,
                                      "decoder_layers": 2, "max_relative_position": 3,
                                      "relative_share_heads": True, **fields}), decode=decode or DecodeConfig())
    tokenizer = Tokenizer(spm_path)
    torch.manual_seed(0)
    model = build_model(cfg.model, tokenizer.vocab_size, PAD_ID)
    without_special_tokens(model)
    spm_info = {"path": str(spm_path), "sha256": tokenizer.sha256(), "model": tokenizer.model_bytes()}
    checkpoint.save({"format": checkpoint.CHECKPOINT_FORMAT, "model": model.state_dict(), "config": to_dict(cfg),
                     "spm": spm_info, "step": 0}, directory, ["model.pt"])
    return directory / "model.pt"


def ct2_translate(model_dir: Path, sentences: list[str], **options) -> list[list[tuple[list[int], float]]]:
    """(ids, score) of each returned hypothesis, translating with the exported directory alone and
    only the options given (CTranslate2's defaults for the rest)."""
    sp = spm.SentencePieceProcessor(model_file=str(model_dir / "sentencepiece.model"))
    translator = ctranslate2.Translator(str(model_dir), device="cpu", intra_threads=1)
    results = translator.translate_batch(sp.encode(sentences, out_type=str), return_scores=True, **options)
    return [[([sp.piece_to_id(p) for p in hyp], score) for hyp, score in zip(r.hypotheses, r.scores)]
            for r in results]


def ct2_hypotheses(model_dir: Path, sentences: list[str], **options) -> list[list[tuple[list[int], float]]]:
    """ct2_translate at beam BEAM."""
    return ct2_translate(model_dir, sentences, beam_size=BEAM, max_batch_size=4, **options)


CASES = {
    "abs-pre": {"positions": PosKind.abs, "norm": Norm.pre},
    "abs-post": {"positions": PosKind.abs, "norm": Norm.post},
    "rel-pre": {"positions": PosKind.rel, "norm": Norm.pre},
    "rel-post": {"positions": PosKind.rel, "norm": Norm.post},
    "both-pre": {"positions": PosKind.both, "norm": Norm.pre},
    "both-post": {"positions": PosKind.both, "norm": Norm.post},
    "keys-only": {"positions": PosKind.rel, "relative_values": False},
    "values-only": {"positions": PosKind.rel, "relative_keys": False, "norm": Norm.post},
    "both-values-only": {"positions": PosKind.both, "relative_keys": False},
    "none": {"positions": PosKind.none, "norm": Norm.post},
    "k0": {"positions": PosKind.rel, "max_relative_position": 0},
    "separate-embeddings": {"positions": PosKind.rel, "share_embeddings": False},
    "rope-pre": {"positions": PosKind.rope, "norm": Norm.pre},
    "rope-post": {"positions": PosKind.rope, "norm": Norm.post},
    "t5-pre": {"positions": PosKind.t5, "norm": Norm.pre},
    "t5-post": {"positions": PosKind.t5, "norm": Norm.post},
}


@pytest.mark.parametrize("case", list(CASES))
def test_forced_length_beam_search_matches_relmt(case, spm_model, tmp_path):
    """Every output is exactly FORCED tokens (relmt: min_len = max_len_b = FORCED, max_len_a = 0;
    CT2: min_decoding_length = max_decoding_length), so the length penalty divides all of a
    sentence's hypotheses by one constant: the K hypotheses must come out identical and in the same
    order, and score * penalty(FORCED) must be the same log-probability in both."""
    ck = random_checkpoint(tmp_path, spm_model, **CASES[case])
    out = export(ck, tmp_path / "ct2")
    ours = Translator.from_checkpoint(ck, device="cpu").hypotheses(
        SENTENCES, beam=BEAM, nbest=BEAM, lenpen=ALPHA, max_len_a=0.0, max_len_b=FORCED, min_len=FORCED,
        eos_candidates=EosCandidates.fairseq)
    theirs = ct2_hypotheses(out, SENTENCES, num_hypotheses=BEAM, length_penalty=ALPHA,
                            min_decoding_length=FORCED, max_decoding_length=FORCED)
    gnmt, ct2_penalty = ((5 + FORCED) / 6) ** ALPHA, FORCED ** ALPHA
    for sentence, mine, other in zip(SENTENCES, ours, theirs):
        assert [h.tokens for h in mine] == [ids for ids, _ in other], sentence
        assert all(len(h.tokens) == FORCED for h in mine)
        np.testing.assert_allclose([s * ct2_penalty for _, s in other], [h.score * gnmt for h in mine],
                                   rtol=1e-4, err_msg=sentence)


# --- the checkpoint's decoding settings (relmt_export.json) as CTranslate2 options ---------------------------

@pytest.mark.parametrize("decode", [
    DecodeConfig(beam=1, max_len_a=1.0, max_len_b=1, max_source_len=4),  # greedy; sources cut to 4 pieces
    DecodeConfig(beam=4, nbest=2, lenpen=0.6, max_len_a=0.0, max_len_b=5, eos_candidates=EosCandidates.fairseq),
    DecodeConfig(sampling=True, beam=1, topk=1, lenpen=0.6, max_len_a=0.0, max_len_b=5),  # topk 1: the argmax
], ids=["greedy", "beam4", "sampling-top1"])
def test_translate_options_decode_as_the_checkpoint_does(decode, spm_model, tmp_path):
    """The random model never ends with EOS (without_special_tokens), so every output runs to the
    step limit floor(a * |x| + b) of its (capped) source: the same lengths, hence the same length
    penalty for all of a sentence's hypotheses, and the same tokens, one sentence per call."""
    ck = random_checkpoint(tmp_path, spm_model, decode=decode, positions=PosKind.rel)
    out = export(ck, tmp_path / "ct2")
    ours = Translator.from_checkpoint(ck, device="cpu").hypotheses(SENTENCES)  # the checkpoint's settings
    sp = spm.SentencePieceProcessor(model_file=str(out / "sentencepiece.model"))
    for sentence, mine in zip(SENTENCES, ours):
        options = translate_options(out, longest_source=len(sp.encode(sentence)))
        theirs = ct2_translate(out, [sentence], **options)[0]
        assert [h.tokens for h in mine] == [ids for ids, _ in theirs], sentence
        # the same log-probabilities, under their own length penalties (CT2: |y|^alpha; relmt: GNMT's)
        n, alpha = len(mine[0].tokens), decode.lenpen
        np.testing.assert_allclose([s * n ** alpha for _, s in theirs],
                                   [h.score * ((5 + n) / 6) ** alpha for h in mine], rtol=1e-4, err_msg=sentence)
    # CTranslate2's own defaults (beam 2, at most 256 tokens) decode otherwise
    assert len(ct2_translate(out, SENTENCES[:1])[0][0][0]) == 256 != len(ours[0][0].tokens)


# --- a trained model, decoding freely --------------------------------------------------------------------

@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> Path:
    """The tiny model with head-shared relative tables, trained for 300 updates."""
    return shared_tiny(tmp_path_factory, "tiny_shared_heads", "model.relative_share_heads=true")


@pytest.mark.parametrize("alpha,norm", [(0.0, LengthNorm.gnmt), (0.6, LengthNorm.power), (1.0, LengthNorm.power)])
def test_free_running_beam_search_matches_relmt_on_a_trained_model(trained, tmp_path, capsys, alpha, norm):
    """With decode.length_norm=power relmt divides by |y|^alpha as CTranslate2 does, so even a length penalty
    picks the same hypotheses with the same scores."""
    out = tmp_path / "ct2"
    assert guarded("relmt-export", _export, [f"checkpoint={trained}", f"output={out}"]) == 0
    assert f"to {out}" in capsys.readouterr().out
    limit = 40
    ours = Translator.from_checkpoint(trained, device="cpu").hypotheses(
        TOY, beam=BEAM, nbest=BEAM, lenpen=alpha, length_norm=norm, max_len_a=0.0, max_len_b=limit,
        eos_candidates=EosCandidates.fairseq, early_stop=True)
    theirs = ct2_hypotheses(out, TOY, num_hypotheses=BEAM, length_penalty=alpha, min_decoding_length=0,
                            max_decoding_length=limit)
    for sentence, mine, other in zip(TOY, ours, theirs):
        assert [h.tokens for h in mine] == [ids for ids, _ in other], sentence
        assert [s for _, s in other] == pytest.approx([h.score for h in mine], rel=1e-4, abs=1e-5), sentence
    assert max(len(h[0].tokens) for h in ours) < limit  # every output ended with EOS


def test_export_directory_and_int8(trained, tmp_path):
    out = export(trained, tmp_path / "int8", quantization="int8")
    names = {p.name for p in out.iterdir()}
    assert {"model.bin", "config.json", "shared_vocabulary.json", "sentencepiece.model", "relmt_export.json"} <= names
    assert (out / "sentencepiece.model").read_bytes() == checkpoint.load(trained)["spm"]["model"]
    vocabulary = json.loads((out / "shared_vocabulary.json").read_text())
    assert vocabulary[:4] == ["<pad>", "<unk>", "<s>", "</s>"]  # relmt's PAD, UNK, BOS, EOS ids
    config = json.loads((out / "config.json").read_text())
    assert config["add_source_eos"] and config["decoder_start_token"] == "<s>" and config["eos_token"] == "</s>"
    info = json.loads((out / "relmt_export.json").read_text())
    assert info["checkpoint"] == str(trained) and info["model"]["positions"] == "rel"
    float32 = export(trained, tmp_path / "float32")
    assert (out / "model.bin").stat().st_size < 0.6 * (float32 / "model.bin").stat().st_size
    # int8 weights (and activations) decode close to float32: the scores (total log-probabilities) differ
    # by less than 10% of their size on average over the sentences, and most outputs are the same. On
    # average, not sentence by sentence: the int8 kernels differ by CPU (AVX-512 or AVX2), and on AVX2
    # this barely trained model's one-token output was 0.54 nats (23%) off; a broken quantization is off
    # by whole nats on every sentence.
    options = {"length_penalty": 0.0, "min_decoding_length": 0, "max_decoding_length": 40}
    int8, full = ct2_hypotheses(out, TOY, **options), ct2_hypotheses(float32, TOY, **options)
    quantized, exact = (np.array([h[0][1] for h in hyps]) for hyps in (int8, full))
    assert np.abs(quantized - exact).mean() < 0.1 * np.abs(exact).mean(), (quantized, exact)
    assert sum(a[0][0] == b[0][0] for a, b in zip(int8, full)) > len(TOY) / 2


# --- what cannot be exported ------------------------------------------------------------------------------

def test_per_head_tables_are_refused_with_the_setting_to_train_with(spm_model, tmp_path, capsys):
    ck = random_checkpoint(tmp_path, spm_model, positions=PosKind.rel, relative_share_heads=False)
    with pytest.raises(UserError, match="relative_share_heads=true"):
        export(ck, tmp_path / "ct2")
    assert guarded("relmt-export", _export, [f"checkpoint={ck}", f"output={tmp_path / 'ct2'}"]) == 2
    err = capsys.readouterr().err
    assert "model.relative_share_heads=false" in err and "one a^K/a^V table per attention head" in err
    assert "Traceback" not in err and not (tmp_path / "ct2").exists()
    # one head: a per-head table is a shared one
    ok = random_checkpoint(tmp_path / "one", spm_model, positions=PosKind.rel, n_heads=1, relative_share_heads=False)
    assert export(ok, tmp_path / "one_head").is_dir()


def test_alibi_is_refused_with_the_reason(spm_model, tmp_path, capsys):
    ck = random_checkpoint(tmp_path, spm_model, positions=PosKind.alibi)
    assert guarded("relmt-export", _export, [f"checkpoint={ck}", f"output={tmp_path / 'ct2'}"]) == 2
    err = capsys.readouterr().err
    assert "model.positions=alibi: CTranslate2's TransformerEncoderSpec has no ALiBi" in err
    assert "Traceback" not in err and not (tmp_path / "ct2").exists()


def test_cli_errors_name_the_key(spm_model, tmp_path, capsys):
    ck = random_checkpoint(tmp_path, spm_model, positions=PosKind.abs)
    out = tmp_path / "ct2"
    assert guarded("relmt-export", _export, [f"checkpoint={ck}", f"output={out}", "format=tflite"]) == 2
    assert "format=tflite: the export formats are ctranslate2, onnx, aoti and argos" in capsys.readouterr().err
    assert guarded("relmt-export", _export, [f"checkpoint={ck}", f"output={out}", "quantization=int3"]) == 2
    assert "quantization=int3: must be one of" in capsys.readouterr().err
    assert guarded("relmt-export", _export, [f"checkpoint={ck}", f"output={out}", "max_positions=0"]) == 2
    assert "max_positions=0: must be >= 1" in capsys.readouterr().err
    assert guarded("relmt-export", _export, [f"checkpoint={tmp_path / 'none.pt'}", f"output={out}"]) == 2
    assert "none.pt: no such checkpoint" in capsys.readouterr().err
    assert not out.exists()
    assert guarded("relmt-export", _export, [f"checkpoint={ck}", f"output={out}"]) == 0
    assert guarded("relmt-export", _export, [f"checkpoint={ck}", f"output={out}"]) == 2
    assert "already exists (give force=true" in capsys.readouterr().err
    assert guarded("relmt-export", _export, [f"checkpoint={ck}", f"output={out}", "force=true"]) == 0
    assert guarded("relmt-export", _export, ["--help"]) == 0


def test_ctranslate2_takes_a_prefix_as_relmt_does_and_annotates_with_relmts_modules(trained):
    """Issue 60: engine=ctranslate2 forces a prefix with its target_prefix (scoring only what follows it, so its
    n-best may rank otherwise than relmt's), and decodes the other sentences of the batch as relmt does; alignments
    and token scores come from relmt's own teacher-forced pass; constraints are refused."""
    from relmt.errors import UserError

    options = dict(beam=BEAM, nbest=BEAM, lenpen=0.6, length_norm=LengthNorm.power, max_len_a=0.0, max_len_b=40,
                   eos_candidates=EosCandidates.fairseq, early_stop=True)
    torch_, ct2 = (Translator.from_checkpoint(trained, device="cpu", engine=e) for e in ("torch", "ctranslate2"))
    prefixes = ["the dog", "", "alice", "", "", "", "my"]
    ours = torch_.hypotheses(TOY, prefixes=prefixes, **options)
    theirs = ct2.hypotheses(TOY, prefixes=prefixes, **options)
    sp = torch_.tokenizer.sp
    for sentence, prefix, mine, other in zip(TOY, prefixes, ours, theirs):
        if prefix:  # every output begins with it; CTranslate2 scores only what follows, so it may rank otherwise
            wanted = sp.encode(prefix, out_type=int)
            assert all(h.tokens[:len(wanted)] == wanted for h in other), sentence
        else:
            assert [h.tokens for h in mine] == [h.tokens for h in other], sentence
            assert [h.score for h in other] == pytest.approx([h.score for h in mine], rel=1e-4, abs=1e-5), sentence
    got = ct2.translations(TOY[:2], prefixes=prefixes[:2], alignments=True, token_scores=True, **options)
    assert got[0][0].text.startswith("the dog") and got[0][0].alignment and got[0][0].token_scores
    with pytest.raises(UserError, match="constraints work on engine=torch, onnx and aoti"):
        ct2.translations(TOY[:1], constraints=[["dog"]])
