"""The ``jetstream`` data source: streams and KV buckets read and written through the gateway."""

from __future__ import annotations

from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    DataSourceStreamWriter,
    DataSourceWriter,
)
from pyspark.sql.types import StructType

from pipeline import options as opts
from pipeline import wire


class JetStreamDataSource(DataSource):
    """``spark.read.format("jetstream")``: a stream (option ``stream``) or a bucket (``bucket``).

    Options: ``url`` (the gateway), ``token``; for streams ``subject``, ``startSequence`` /
    ``endSequence`` or ``startTime`` / ``endTime``, ``partitions``; for buckets ``keys``,
    ``asOfRevision`` / ``asOfTime``, ``includeHistory``; for streaming reads
    ``startingOffsets`` and ``maxRecordsPerTrigger``; for writes and streaming writes
    ``subject``, ``writeId``, ``publishBatch``.
    """

    @classmethod
    def name(cls) -> str:
        return "jetstream"

    def _options(self) -> opts.Options:
        return opts.parse(self.options)

    def schema(self) -> StructType:
        return wire.kv_schema() if self._options().bucket is not None else wire.stream_schema()

    def reader(self, schema: StructType) -> DataSourceReader:
        options = self._options()
        if options.bucket is not None:
            from pipeline.kv import KvReader

            return KvReader(options)
        from pipeline.streams import StreamBatchReader

        return StreamBatchReader(options)

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        from pipeline.streams import StreamMicroBatchReader

        return StreamMicroBatchReader(self._options())

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        from pipeline.writer import JetStreamWriter

        return JetStreamWriter(opts.parse(self.options, writing=True), schema, overwrite)

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        from pipeline.writer import JetStreamStreamWriter

        return JetStreamStreamWriter(opts.parse(self.options, writing=True), schema, overwrite)
