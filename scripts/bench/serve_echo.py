#!/usr/bin/env python
"""relmt-serve whose translator answers at once: the server's own floor (issue 70 §1).

The real relmt-serve process (`relmt.serve.main`: its arguments, uvicorn, the HTTP routes, request parsing and
checks, the queue, the Batcher's decoding thread, the metrics, the answer's JSON), with the checkpoint's Translator
loaded as relmt-serve loads it and its search replaced by an echo: each sentence's hypothesis is its own source
pieces, returned without touching the model. What a request then costs is everything but decoding. The echo has no
running search to join, so the Batcher decodes it batch by batch (continuous batching needs a model's search).
scripts/bench/bench_serve.py --echo drives it as it drives relmt-serve.

    python scripts/bench/serve_echo.py checkpoint=runs/x/checkpoints/last.pt host=127.0.0.1 port=0
"""

from __future__ import annotations

from relmt.decode import translator as translating
from relmt.decode.beam import Hypothesis
from relmt.serve.main import main

_load = translating.Translator.from_checkpoints.__func__


def echo_translator(cls, *args, **kwargs):
    translator = _load(cls, *args, **kwargs)

    def hypotheses(sentences, **_):
        return [[Hypothesis(ids, 0.0)] for ids in translator.tokenizer.encode(sentences)]

    translator.hypotheses = hypotheses
    translator.model = None  # no search to join: relmt.decode.continuous.supports says no
    return translator


if __name__ == "__main__":
    translating.Translator.from_checkpoints = classmethod(echo_translator)
    main()
