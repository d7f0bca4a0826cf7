"""The embedded Spark's defaults: enough heap for the local JVM, splits that stay small."""

from __future__ import annotations

from spark_backfill.session import LOCAL_JAVA_OPTIONS, LOCAL_MAX_PARTITION_BYTES, local_defaults, local_driver_memory

GIB = 1 << 30


def test_local_driver_memory_is_half_the_machine_within_1_to_8_gib() -> None:
    assert local_driver_memory(24 * GIB) == "8g"
    assert local_driver_memory(8 * GIB) == "4g"
    assert local_driver_memory(3 * GIB) == "1g"
    assert local_driver_memory(512 << 20) == "1g"


def test_local_defaults_raise_the_heap_and_bound_the_splits() -> None:
    defaults = local_defaults()
    assert defaults["spark.sql.files.maxPartitionBytes"] == LOCAL_MAX_PARTITION_BYTES
    assert defaults["spark.driver.memory"] == local_driver_memory()


def test_the_embedded_jvm_compiles_with_c1_only() -> None:
    assert local_defaults()["spark.driver.extraJavaOptions"] == LOCAL_JAVA_OPTIONS == "-XX:TieredStopAtLevel=1"


def test_the_test_session_runs_the_embedded_defaults(spark) -> None:
    """What the CLI's local session gets reaches the JVM (its own input arguments)."""
    args = spark.sparkContext._jvm.java.lang.management.ManagementFactory.getRuntimeMXBean().getInputArguments()
    assert LOCAL_JAVA_OPTIONS in list(args)


def test_shuffle_partitions_are_four_per_local_core() -> None:
    import os

    from spark_backfill.session import local_cores

    assert [local_cores(m) for m in ("local", "local[1]", "local[3]", "local[2,4]")] == [1, 1, 3, 2]
    assert local_cores("local[*]") == os.cpu_count()
    assert local_defaults(3)["spark.sql.shuffle.partitions"] == "12"
