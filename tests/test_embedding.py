"""The library is easy to embed (issue 29 §5): loading a Translator changes nothing process-wide;
relmt-translate opts in to relmt.runtime.tune_cpu itself."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from relmt import runtime
from relmt.cli.common import guarded
from relmt.cli.translate import _translate
from relmt.decode.translator import Translator
from tests.tiny_checkpoints import SENTENCES, toy_tokenizer, write_checkpoint


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("embed")
    return write_checkpoint(tmp, "model.pt", toy_tokenizer(tmp), seed=1)


def flushes_denormals() -> bool:
    """Whether float arithmetic flushes results below 1e-38 to zero (torch has no getter)."""
    return (torch.full((4,), 1e-30) * 1e-10)[0].item() == 0.0


@pytest.fixture
def untuned():
    """A process as tune_cpu has not touched it (denormals kept), restored afterwards."""
    flush, applied = flushes_denormals(), dict(runtime._applied)
    torch.set_flush_denormal(False)
    runtime._applied.clear()
    yield
    torch.set_flush_denormal(flush)
    runtime._applied.clear()
    runtime._applied.update(applied)


def test_a_translator_leaves_the_process_settings_alone(ckpt, untuned, monkeypatch):
    calls = []
    monkeypatch.setattr(runtime, "tune_cpu", lambda: calls.append(1) or {})
    translator = Translator.from_checkpoint(ckpt, device="cpu")
    translator.translate(SENTENCES[:2])
    assert not flushes_denormals() and not runtime._applied and not calls


def test_relmt_translate_tunes_its_own_process(ckpt, tmp_path, monkeypatch):
    calls = []
    monkeypatch.setattr(runtime, "tune_cpu", lambda: calls.append(1) or {})
    src = tmp_path / "in.txt"
    src.write_text(f"{SENTENCES[0]}\n", encoding="utf-8")
    assert guarded("relmt-translate", _translate, [f"checkpoint={ckpt}", f"input={src}",
                                                   f"output={tmp_path / 'out.txt'}", "device=cpu"]) == 0
    assert calls == [1]


def test_tune_cpu_flushes_denormals_in_each_thread_that_calls_it(untuned):
    """The flush is a setting of each thread (a new thread copies its creator's), so a thread that existed before
    the first call, a pool's worker say, has it only once it calls tune_cpu itself; a second call used to do
    nothing."""
    import threading

    go, seen = threading.Event(), {}

    def worker() -> None:
        go.wait(30)
        seen["before"] = flushes_denormals()
        runtime.tune_cpu()
        seen["after"] = flushes_denormals()

    thread = threading.Thread(target=worker)
    thread.start()  # created before any call: not flushing
    runtime.tune_cpu()
    go.set()
    thread.join()
    assert flushes_denormals() and seen == {"before": False, "after": True}
