"""relmt-serve: an HTTP translation server over relmt.decode.translator.Translator.

    relmt-serve checkpoint=runs/x/checkpoints/best.pt engine=torch host=127.0.0.1 port=8000

One module per idea: args (ServeArgs, the limits and their defaults), security (who may bind and
call), requests (parsing and checking a request body), batcher (one decoding thread that owns the
Translator and batches sentences across requests), metrics (Prometheus), pipeline (one translation request
from body to answer, whichever API it came by), app (the routes), libretranslate (LibreTranslate's API),
markup (its text and HTML cut into sentences), page (the HTML form at /), protocol (uvicorn's HTTP protocol
with a deadline on request heads) and main (the process: socket, uvicorn, signals). It sits at the CLI layer:
it imports relmt.decode and relmt.config, never relmt.train.
"""
