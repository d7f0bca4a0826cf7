"""The pure core: trace message bytes in, span records and OTLP bytes out.

decode -> ids -> mapping -> encode, glued by `pipeline`. No clock, no randomness, no
logging, no I/O, and nothing of nats, pyspark, grpc, the OTel SDK, prometheus_client or
asyncio (tests/core/test_purity.py checks it): the live bridge and the Spark backfill
import these modules, so their spans can never drift apart.
"""
