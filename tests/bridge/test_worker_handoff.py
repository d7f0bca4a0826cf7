"""Worker processes get each message once: `observe` sends it, `process` names it by token."""

from __future__ import annotations

import asyncio

from nats_otel.bridge.settings import load_settings
from nats_otel.bridge.workers import WorkerPool
from nats_otel.core.pipeline import Converted, convert_batch
from nats_otel.devkit.receivers import OTLPGrpcReceiver


def test_observed_batches_are_processed_by_token_and_others_whole(corpus_raws):
    with OTLPGrpcReceiver() as rx:
        settings = load_settings(overrides={
            "sources": [{"name": "a", "urls": ["nats://127.0.0.1:4222"], "subjects": ["t"]}],
            "otlp": {"endpoint": rx.endpoint}, "batch": {"workers": 2}}, env={})
        pool = WorkerPool(settings, 2)
        pool.start()
        sent: list[object] = []
        for worker in pool._workers:  # record what goes down each pipe
            original = worker.submit
            worker.submit = (lambda batch_id, items, deadline, original=original:  # type: ignore[method-assign]
                             sent.append(items) or original(batch_id, items, deadline))
        try:
            observed, unobserved = list(corpus_raws), list(corpus_raws)
            pool.observe(observed)
            first = asyncio.run(pool.process(observed, None))
            second = asyncio.run(pool.process(unobserved, None))  # never observed: sent whole
        finally:
            pool.close()
    assert pool._observed == {}
    assert [type(items) for items in sent] == [int, int, list, list]
    expected = sum(len(r.spans) for r in convert_batch(corpus_raws) if isinstance(r, Converted))
    for outcomes in (first, second):
        assert sum(outcome.span_count for _, outcome in outcomes) == expected
        assert sorted(p for positions, _ in outcomes for p in positions) == list(range(len(corpus_raws)))
