// hqueue's Thrift API (SPEC C9): the HQueue seed's calls, with their names
// and argument orders, plus admin calls, for clients in any language.
//
// Transport and protocol: framed transport, binary protocol (an Apache Thrift
// generated client uses TFramedTransport + TBinaryProtocol).
//
// Every call declares the exceptions it can raise, so a Java, Node or C++
// client sees a typed error rather than a dropped connection.

namespace java org.hqueue.thrift
namespace py hqueue_thrift
namespace js hqueue

struct TMessageID {
  1: i64 timestamp,
  2: i16 sequenceID
}

struct TMessage {
  1: optional TMessageID id,
  2: optional i16 partitionID,
  3: binary topic,
  4: binary value
}

// startID inclusive, stopID exclusive; no topics means all topics.
struct TMessageScan {
  1: optional TMessageID startID,
  2: optional TMessageID stopID,
  3: optional list<binary> topics
}

struct TQueueInfo {
  1: string name,
  2: i32 partitions,
  3: i32 ttl = 0,
  4: string durability = "SYNC_WAL",
  5: string state = "ENABLED",
  6: map<string, string> config,
  7: i32 maxMessageBytes = 4194304
}

struct TQueueDescription {
  1: TQueueInfo info,
  // -1 when the store cannot count cheaply (HBase).
  2: i64 messageCountEstimate,
  // partition id -> last ID; absent for an empty partition.
  3: map<i16, TMessageID> lastIDs
}

exception TQueueNotFound {
  1: string message,
  2: string queue
}

exception TQueueExists {
  1: string message,
  2: string queue
}

exception TQueueDisabled {
  1: string message,
  2: string queue
}

// Malformed or oversized messages, bad partition ids, bad names or settings.
exception TInvalidMessage {
  1: string message
}

// This server does not own the partition; owner is host:port of the one
// that does, or empty while nobody does (during failover or rebalance).
exception TNotPartitionOwner {
  1: string message,
  2: string owner
}

// The store or coordination failed; the call may be retried.
exception TIOError {
  1: string message
}

service HQueueService {
  // -- scanners (server side; closed by messageScannerClose or an idle timeout)
  i32 messageScannerOpen(1: string queue, 2: i16 partitionID, 3: TMessageScan scan)
      throws (1: TQueueNotFound notFound, 2: TQueueDisabled disabled, 3: TInvalidMessage invalid, 4: TIOError io)
  // The next message; at the end, a TMessage with no id.
  TMessage messageScannerGet(1: i32 scannerID)
      throws (1: TInvalidMessage invalid, 2: TIOError io)
  // Up to nbMessages messages; an empty list at the end.
  list<TMessage> messageScannerGetList(1: i32 scannerID, 2: i32 nbMessages)
      throws (1: TInvalidMessage invalid, 2: TIOError io)
  void messageScannerClose(1: i32 scannerID)
      throws (1: TInvalidMessage invalid, 2: TIOError io)

  // -- puts: the server assigns IDs and returns them
  TMessageID putMessage(1: string queue, 2: TMessage message)
      throws (1: TQueueNotFound notFound, 2: TQueueDisabled disabled, 3: TInvalidMessage invalid,
              4: TNotPartitionOwner notOwner, 5: TIOError io)
  list<TMessageID> putMessages(1: string queue, 2: list<TMessage> messages)
      throws (1: TQueueNotFound notFound, 2: TQueueDisabled disabled, 3: TInvalidMessage invalid,
              4: TNotPartitionOwner notOwner, 5: TIOError io)
  TMessageID putMessageWithPid(1: string queue, 2: i16 partitionID, 3: TMessage message)
      throws (1: TQueueNotFound notFound, 2: TQueueDisabled disabled, 3: TInvalidMessage invalid,
              4: TNotPartitionOwner notOwner, 5: TIOError io)
  list<TMessageID> putMessagesWithPid(1: string queue, 2: i16 partitionID, 3: list<TMessage> messages)
      throws (1: TQueueNotFound notFound, 2: TQueueDisabled disabled, 3: TInvalidMessage invalid,
              4: TNotPartitionOwner notOwner, 5: TIOError io)

  // host:port of each partition's owner, by partition id; "" where none.
  list<string> getQueueLocations(1: string queue)
      throws (1: TQueueNotFound notFound, 2: TIOError io)

  // -- admin
  void createQueue(1: TQueueInfo info)
      throws (1: TQueueExists exists, 2: TInvalidMessage invalid, 3: TIOError io)
  TQueueDescription describeQueue(1: string queue)
      throws (1: TQueueNotFound notFound, 2: TIOError io)
  list<TQueueInfo> listQueues()
      throws (1: TIOError io)
  void truncateQueue(1: string queue)
      throws (1: TQueueNotFound notFound, 2: TIOError io)
  void disableQueue(1: string queue)
      throws (1: TQueueNotFound notFound, 2: TIOError io)
  void enableQueue(1: string queue)
      throws (1: TQueueNotFound notFound, 2: TIOError io)
  // The queue must be disabled first, as in HBase.
  void dropQueue(1: string queue)
      throws (1: TQueueNotFound notFound, 2: TInvalidMessage invalid, 3: TIOError io)
}

// Served by each subscriber (SPEC C7): the server pushes batches to it.
// Returns 0 when the batch was processed; any other value asks for a retry.
service HQueueSubscriberService {
  i32 consumeMessages(1: list<TMessage> messages)
}
