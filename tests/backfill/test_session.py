"""The embedded SparkSession as `build_session` starts it."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.spark


def test_embedded_spark_runs_with_the_local_defaults(spark) -> None:
    """The heap and split settings reach the JVM (Spark's 1g heap ran out at 250k messages)."""
    from spark_backfill.session import local_defaults, local_driver_memory

    assert spark.conf.get("spark.sql.files.maxPartitionBytes") == local_defaults()["spark.sql.files.maxPartitionBytes"]
    heap = spark.sparkContext._jvm.java.lang.Runtime.getRuntime().maxMemory()
    wanted = int(local_driver_memory().removesuffix("g")) << 30
    assert heap > 0.85 * wanted, f"JVM max heap {heap >> 20} MiB, wanted {wanted >> 20} MiB"
