"""Prometheus metrics of one server (a registry of its own, not prometheus_client's global one)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)


class Metrics:
    content_type = CONTENT_TYPE_LATEST

    def __init__(self) -> None:
        self.registry = r = CollectorRegistry()
        self.requests = Counter("relmt_serve_requests", "Translation requests answered, by HTTP status",
                                ["status"], registry=r)
        self.errors = Counter("relmt_serve_errors", "Requests refused or failed, by kind (docs/serving.md)",
                              ["kind"], registry=r)
        self.latency = Histogram("relmt_serve_request_seconds", "Time from a translation request's arrival to "
                                 "its answer", buckets=LATENCY_BUCKETS, registry=r)
        self.batch_size = Histogram("relmt_serve_batch_sentences", "Sentences in each decoded batch "
                                    "(continuous batching: in each step)",
                                    buckets=BATCH_BUCKETS, registry=r)
        self.batch_seconds = Histogram("relmt_serve_batch_seconds", "Decoding time of each batch "
                                       "(continuous batching: of each step)",
                                       buckets=LATENCY_BUCKETS, registry=r)
        self.queue = Gauge("relmt_serve_queue_sentences", "Sentences waiting for the decoder", registry=r)
        self.in_progress = Gauge("relmt_serve_requests_in_progress", "Translation requests accepted and not yet "
                                 "answered", registry=r)
        self.apart = Counter("relmt_serve_decoded_apart", "Translation requests the running search (continuous "
                             "batching) could not take, decoded batch by batch, by reason: constraints, prefix, "
                             "sampling", ["reason"], registry=r)
        self.cancelled = Counter("relmt_serve_cancelled", "Requests whose client left before they were decoded: "
                                 "before their batch was taken, or (continuous batching) while in the running "
                                 "search, whose sentences then left it before its next step", registry=r)
        self.cancelled_sentences = Counter("relmt_serve_cancelled_sentences", "Sentences taken out of the running "
                                           "search (continuous batching) because their client left", registry=r)

    def left_search(self, jobs: int, sentences: int) -> None:
        self.cancelled.inc(jobs)
        self.cancelled_sentences.inc(sentences)

    def observe_batch(self, sentences: int, seconds: float) -> None:
        self.batch_size.observe(sentences)
        self.batch_seconds.observe(seconds)

    def text(self) -> bytes:
        return generate_latest(self.registry)
