"""Spark backfill: historical trace messages -> the same spans the bridge produces, at scale.

extract (`sources`) -> transform (`transform`, the nats_otel core inside executors)
-> load (`sinks`); `completeness` marks traces with a missing downstream server, and
`report` draws hop latencies from the Parquet span table.
"""

__all__ = ["__version__"]

__version__ = "0.2.0"
