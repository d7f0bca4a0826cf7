"""Everything shipped to executors pickles (cloudpickle, as Spark does) and still works."""

from __future__ import annotations

import functools
import pickle
from pathlib import Path

import pytest
from pyspark import cloudpickle

from nats_otel.core.report_ledger import report_runs
from spark_backfill import completeness, jetstream, keys, runs, sinks, transform
from tests.backfill.conftest import corpus_files

pytestmark = pytest.mark.spark


def _roundtrip(obj):
    return pickle.loads(cloudpickle.dumps(obj))


def test_shipped_functions_and_settings_pickle_and_behave_the_same():
    import pyarrow as pa
    import pyarrow.compute as pc

    lines = [line.decode() for line in Path(corpus_files()[1]).read_bytes().splitlines(keepends=True) if line.strip()]
    settings = keys.ConvertSettings()
    keyed = [keys.line_key(line, settings) for line in lines]
    run_index = runs.RunIndex(report_runs((k.server_id, k.seq, k.ts_ns) for k in keyed if k.seq is not None))
    shipped = [
        functools.partial(transform._convert_groups, settings=settings, run_index=run_index),
        sinks.otlp_json_lines,
        functools.partial(sinks._export_batches, settings=sinks.OtlpExportSettings("http://127.0.0.1:1")),
        functools.partial(completeness._placeholder_batches, schema=transform.ddl(transform.SPAN_COLUMNS)),
        jetstream.JetStreamDataSource({"servers": "nats://127.0.0.1:1", "stream": "S"}).reader(None),
        jetstream.JetStreamRange(1, 10),
        functools.partial(keys._key_frame, settings=settings),
    ]
    for obj in shipped:
        assert _roundtrip(obj) is not None
    lines_batch = pa.RecordBatch.from_pydict({"value": lines, "source": ["x"] * len(lines)})
    batch = next(iter(shipped[-1]([lines_batch])))
    assert batch.equals(next(iter(_roundtrip(shipped[-1])([lines_batch]))))
    # The conversion reads the good records, grouped by context (sorted by key).
    good = batch.filter(pc.is_null(batch.column("reject_reason"))).to_pylist()
    good.sort(key=lambda row: row["ctx_key"])
    batch = pa.RecordBatch.from_pylist(good, schema=batch.schema)
    direct = next(iter(shipped[0]([batch])))
    again = next(iter(_roundtrip(shipped[0])([batch])))
    assert direct.num_rows > len(lines)
    assert direct.equals(again)
    assert _roundtrip(settings) == settings


def test_the_key_pass_of_local_splits_is_the_key_pass_of_their_lines(tmp_path):
    """The key pass reading local files itself (`splits`) keys the records as the key pass
    of Spark's lines of them: only `source` is named by the file rather than given."""
    import pyarrow as pa

    from spark_backfill import splits

    path = Path(corpus_files()[1])
    lines = [line.decode() for line in path.read_bytes().splitlines(keepends=True) if line.strip()]
    settings = keys.ConvertSettings(batch_rows=7)
    tasks = splits.plan([str(path)], max_split_bytes=20_000, cores=2, open_cost=1)
    shipped = _roundtrip(functools.partial(keys._key_local, tasks=tasks, settings=settings))
    ids = pa.RecordBatch.from_pydict({"id": list(range(len(tasks)))})
    local = pa.Table.from_batches(list(shipped([ids])))
    frame = pa.Table.from_batches(list(keys._key_frame(
        [pa.RecordBatch.from_pydict({"value": lines, "source": [path.as_uri()] * len(lines)})], settings)))
    assert len(tasks) > 1 and local.num_rows == len(lines)
    assert sorted(local.to_pylist(), key=str) == sorted(frame.to_pylist(), key=str)
