"""HBase 2.x's Thrift2 admin calls: pre-split tables, ASYNC_WAL, truncate that keeps splits."""

from __future__ import annotations

from typing import Any

from thriftpy2.protocol import TBinaryProtocolFactory, TCompactProtocolFactory
from thriftpy2.rpc import make_client
from thriftpy2.thrift import TException
from thriftpy2.transport import TBufferedTransportFactory, TFramedTransportFactory, TTransportException

from ...config import Durability, QueueInfo
from ...errors import InvalidArgument, StorageError
from ...rpc import idl
from .cells import FAMILY, StorageUnavailable, split_keys


class Thrift2Admin:
    """HBase 2.x Thrift2 admin calls (``thrift/hbase2_admin.thrift``).

    A connection is made per call: admin calls are rare, and a long-lived
    idle socket would only be one more thing to fail.
    """

    def __init__(self, address: str, transport: str, protocol: str, timeout: int) -> None:
        host, _, port = address.rpartition(":")
        if not host or not port.isdigit():
            raise InvalidArgument(f"'admin' must be host:port, got {address!r}")
        self.host, self.port, self.timeout = host, int(port), timeout
        self._idl = idl.load("hbase2_admin.thrift")
        self._transport: Any = {"buffered": TBufferedTransportFactory, "framed": TFramedTransportFactory}[transport]()
        self._protocol = {"binary": TBinaryProtocolFactory, "compact": TCompactProtocolFactory}[protocol]()

    def _call(self, what: str, method: str, *args):
        try:
            client = make_client(
                self._idl.THBaseService,
                self.host,
                self.port,
                proto_factory=self._protocol,
                trans_factory=self._transport,
                timeout=self.timeout,
            )
        except (TException, OSError) as e:
            raise StorageUnavailable(f"HBase Thrift2 at {self.host}:{self.port}: {what}: {e}") from e
        try:
            return getattr(client, method)(*args)
        except (TTransportException, OSError) as e:
            raise StorageUnavailable(f"HBase Thrift2 at {self.host}:{self.port}: {what}: {e}") from e
        except TException as e:
            raise StorageError(f"HBase Thrift2 at {self.host}:{self.port}: {what}: {getattr(e, 'message', e)}") from e
        finally:
            client.close()

    def create_table(self, table: bytes, info: QueueInfo, compression: str) -> None:
        """Create ``table`` pre-split at partition boundaries."""
        t = self._idl
        family = t.TColumnFamilyDescriptor(
            name=FAMILY,
            maxVersions=1,
            timeToLive=info.ttl or None,
            compressionType=getattr(t.TCompressionAlgorithm, compression.upper()),
        )
        durability = {
            Durability.SYNC_WAL: t.TDurability.SYNC_WAL,
            Durability.ASYNC_WAL: t.TDurability.ASYNC_WAL,
            Durability.SKIP_WAL: t.TDurability.SKIP_WAL,
        }[info.durability]
        descriptor = t.TTableDescriptor(
            tableName=t.TTableName(qualifier=table), columns=[family], durability=durability
        )
        splits = split_keys(info.partitions, info.partitions_per_region)
        self._call(f"create table {table!r}", "createTable", descriptor, splits)

    def truncate_table(self, table: bytes) -> None:
        """Delete every row of a disabled table, keeping its regions."""
        self._call(f"truncate table {table!r}", "truncateTable", self._idl.TTableName(qualifier=table), True)
