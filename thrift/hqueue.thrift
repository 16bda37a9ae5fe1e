// hqueue's Thrift API (SPEC C9): the HQueue seed's calls, with their names
// and argument orders, plus admin calls, for clients in any language.
//
// Transport and protocol: framed transport, strict binary protocol (an Apache
// Thrift generated client uses TFramedTransport + TBinaryProtocol, strictWrite
// as by default). Replies: docs/server.md says how big they get (raise the
// client's frame limit for messageScannerGetPacked), and with an auth file each
// connection calls authenticate(token) first.
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

// A subscriber's registration (SPEC C7). A checkpoint is the first ID not
// yet delivered in that partition: delivery resumes there.
// What a subscriber announces with its address: the 32-byte key servers prove
// pushes with, and (when it listens with TLS) the SHA-256 hex fingerprint of
// its certificate, which servers pin.
struct TPushKey {
  1: binary key,
  2: optional string certificate
}

struct TPushProof {
  1: string queue,
  2: string subscriber,
  3: i16 partitionID,
  4: i64 epoch,
  5: i64 sequence,
  6: binary mac
}

struct TSubscriberInfo {
  1: string name,
  2: string queue,
  // absent: all topics / all partitions
  3: optional list<binary> topics,
  4: optional list<i16> partitions,
  5: map<i16, TMessageID> checkpoints,
  // host:port while the subscriber is attached; "" while it is away
  6: string address,
  // per partition: messages and milliseconds between checkpoint and last message
  7: map<i16, i64> lagMessages,
  8: map<i16, i64> lagMillis
}

// Where a subscription starts in one partition; no startID: from the
// existing checkpoint, or from now for a new subscriber.
struct TPartitionStart {
  1: i16 partitionID,
  2: optional TMessageID startID
}

// What putPacked wrote: count IDs from firstID on, as the allocator gives them
// (the sequence counts up; past 32767 it goes on at 0 in the next millisecond).
struct TPutResult {
  1: TMessageID firstID,
  2: i32 count
}

// Who sends a put, so that the put sent again after a broken connection is
// written once (idempotent puts). A client keeps lanes: a lane is 16 random
// bytes, and carries one put at a time, numbered 1, 2, 3, ... The partition's
// writer keeps each lane's last put (in the same write as its messages, for an
// hour); a put whose lane and sequence it has written already is answered with
// that put's IDs and not written again. resent: this put may have been sent
// before (the writer then also reads the store, not only what it holds).
// A TRequest with an empty lane is none (the put is not idempotent).
struct TRequest {
  1: binary lane,
  2: i64 sequence,
  3: bool resent,
  /** The queue's hqueue.created the client checked and routed the put by: a queue deleted
      and made again since is refused with TQueueNotFound, nothing written (unset: not checked). */
  4: optional string created
}

/** A timer message (SPEC X1): written to partitionID at due (epoch ms). */
struct TTimer {
  1: i16 partitionID,
  2: i64 due,
  3: TMessageID id
}

/** A pending timer and the message it will deliver. */
struct TPendingTimer {
  1: TTimer timer,
  2: binary topic,
  3: binary value
}

/** Messages leased to a consumer group's member: messages packed as
    messageScannerGetPacked packs them (cell keys: rowkey + topic), and each
    one's attempt (1: its first delivery), in the same order; leaseMillis: the
    lease they were given (the one asked for, at most the server's --max-lease);
    acked: a groupAckReceive's ack count (as groupAck's answer). */
struct TDeliveries {
  1: binary messages,
  2: list<i32> attempts,
  3: optional i32 leaseMillis,
  4: optional i32 acked
}

/** One consumer group's progress over one partition. */
struct TGroupPartition {
  1: TMessageID done,
  2: TMessageID scan,
  3: i32 inFlight,
  4: i32 retrying,
  5: i32 ackedAhead,
  6: i64 retries,
  7: i64 lagMessages,
  8: i64 lagMillis,
  /** Past their retries, waiting for the dead-letter queue to take them (it refused: disabled, say). */
  9: i32 deadLetterWaiting,
  /** Messages waiting behind an earlier one of their key (a group with key affinity). */
  10: i32 heldBack,
  /** Messages the group moved from this partition to <queue>.dlq, ever (stored). */
  11: i64 deadLettered
}

/** A message a consumer group has handed out and not finished (groupPending). */
struct TPending {
  1: i16 partitionID,
  2: TMessageID id,
  /** The member holding its lease; "" while it waits to be retried. */
  3: string member,
  /** 1 for a first delivery. */
  4: i32 attempt,
  /** Milliseconds its lease has left, or -1. */
  5: i64 leaseLeftMillis,
  /** Milliseconds before it goes out again, or -1. */
  6: i64 retryInMillis
}

/** A consumer group, as one server sees it: partitions are those it owns. */
struct TGroupInfo {
  1: string queue,
  2: string group,
  3: optional list<binary> topics,
  4: i64 startMillis,
  5: i32 maxRetries,
  6: list<string> members,
  7: map<i16, TGroupPartition> partitions,
  /** Messages in <queue>.dlq; unset while it cannot be read (a disabled table on HBase). */
  8: optional i64 deadLetters,
  /** "topic" or "partition": the key the group hands out in order; unset: none. */
  9: optional string keyAffinity
}

exception TGroupNotFound {
  1: string message,
  2: string group
}

exception TQueueNotFound {
  1: string message,
  2: string queue
}

exception TPushRefused {
  1: string message
}

exception TSubscriberNotFound {
  1: string message,
  2: string name
}

exception TQueueExists {
  1: string message,
  2: string queue
}

exception TQueueDisabled {
  1: string message,
  2: string queue
}

// Malformed or oversized messages, bad partition ids, bad names or settings;
// a call over one of the server's limits, as "LimitExceeded: <limit>=<value>: ..."
// (max_frame_bytes, max_put_messages, max_put_bytes).
exception TInvalidMessage {
  1: string message
}

// This server does not own the partition; owner is host:port of the one
// that does, or empty while nobody does (during failover or rebalance).
exception TNotPartitionOwner {
  1: string message,
  2: string owner
}

// The connection has not authenticated, or its token's roles do not cover
// this call on this queue (servers started with --auth-file).
exception TNotAuthorized {
  1: string message
}

// The store or coordination failed; the call may be retried. Also a call the
// server refused unread, as "ServerBusy: max_inflight_bytes=N: ..." (its calls
// under way hold all the memory it allows them; retry), or as "LimitExceeded:
// max_frame_bytes=N: ..." for authenticate, the one call that does not declare
// TInvalidMessage (every other call answers an argument it refuses, a bad
// group or member name say, with TInvalidMessage "Kind: ...").
exception TIOError {
  1: string message
}

service HQueueService {
  // -- authentication: the first call on a connection to a server started with
  // --auth-file; every later call on the connection acts with the token's roles.
  void authenticate(1: string token)
      throws (1: TNotAuthorized denied, 2: TIOError io)

  // -- scanners (server side; closed by messageScannerClose or an idle timeout)
  i32 messageScannerOpen(1: string queue, 2: i16 partitionID, 3: TMessageScan scan)
      throws (1: TQueueNotFound notFound, 2: TQueueDisabled disabled, 3: TInvalidMessage invalid, 4: TIOError io, 5: TNotAuthorized denied)
  // The next message; at the end, a TMessage with no id.
  TMessage messageScannerGet(1: i32 scannerID)
      throws (1: TInvalidMessage invalid, 2: TIOError io, 3: TNotAuthorized denied)
  // Up to nbMessages messages; an empty list at the end.
  list<TMessage> messageScannerGetList(1: i32 scannerID, 2: i32 nbMessages)
      throws (1: TInvalidMessage invalid, 2: TIOError io, 3: TNotAuthorized denied)
  void messageScannerClose(1: i32 scannerID)
      throws (1: TInvalidMessage invalid, 2: TIOError io, 3: TNotAuthorized denied)

  // A batch as one binary blob, the fast path (hqueue/rpc/packed.py): a u32
  // count, count u32 key lengths, count u32 value lengths (little-endian), then
  // the keys, then the values. Up to nbMessages; an empty batch at the end.
  // Each key is the message's 12-byte rowkey (i16 partition, i64 timestamp,
  // i16 sequence, big-endian) followed by its topic.
  binary messageScannerGetPacked(1: i32 scannerID, 2: i32 nbMessages)
      throws (1: TInvalidMessage invalid, 2: TIOError io, 3: TNotAuthorized denied)

  // -- puts: the server assigns IDs and returns them
  // A put carries at most the server's --max-put-messages (10,000) messages and
  // --max-put-bytes (16 MiB) of topics and values; over that, invalid with
  // "LimitExceeded: max_put_messages=N: ..." (or max_put_bytes=N), nothing written.
  // The packed layout above, with topics as keys; all to one partition.
  // With request (TRequest above), a put sent again is written once.
  TPutResult putPacked(1: string queue, 2: i16 partitionID, 3: binary messages, 4: optional TRequest request)
      throws (1: TQueueNotFound notFound, 2: TQueueDisabled disabled, 3: TInvalidMessage invalid,
              4: TNotPartitionOwner notOwner, 5: TIOError io, 6: TNotAuthorized denied)
  // putMessage and putMessages choose the partition (any the server owns): a
  // TMessage's partitionID is not read; the WithPid calls and putPacked take one.
  TMessageID putMessage(1: string queue, 2: TMessage message)
      throws (1: TQueueNotFound notFound, 2: TQueueDisabled disabled, 3: TInvalidMessage invalid,
              4: TNotPartitionOwner notOwner, 5: TIOError io, 6: TNotAuthorized denied)
  list<TMessageID> putMessages(1: string queue, 2: list<TMessage> messages)
      throws (1: TQueueNotFound notFound, 2: TQueueDisabled disabled, 3: TInvalidMessage invalid,
              4: TNotPartitionOwner notOwner, 5: TIOError io, 6: TNotAuthorized denied)
  TMessageID putMessageWithPid(1: string queue, 2: i16 partitionID, 3: TMessage message)
      throws (1: TQueueNotFound notFound, 2: TQueueDisabled disabled, 3: TInvalidMessage invalid,
              4: TNotPartitionOwner notOwner, 5: TIOError io, 6: TNotAuthorized denied)
  list<TMessageID> putMessagesWithPid(1: string queue, 2: i16 partitionID, 3: list<TMessage> messages)
      throws (1: TQueueNotFound notFound, 2: TQueueDisabled disabled, 3: TInvalidMessage invalid,
              4: TNotPartitionOwner notOwner, 5: TIOError io, 6: TNotAuthorized denied)

  // host:port of each partition's owner, by partition id; "" where none.
  list<string> getQueueLocations(1: string queue)
      throws (1: TQueueNotFound notFound, 2: TIOError io, 3: TNotAuthorized denied, 4: TInvalidMessage invalid)

  // -- admin
  void createQueue(1: TQueueInfo info)
      throws (1: TQueueExists exists, 2: TInvalidMessage invalid, 3: TIOError io, 4: TNotAuthorized denied)
  TQueueDescription describeQueue(1: string queue)
      throws (1: TQueueNotFound notFound, 2: TIOError io, 3: TNotAuthorized denied, 4: TInvalidMessage invalid)
  list<TQueueInfo> listQueues()
      throws (1: TIOError io, 2: TNotAuthorized denied, 3: TInvalidMessage invalid)
  // One queue's definition alone: cheap, unlike describeQueue (which reads
  // every partition's last ID).
  TQueueInfo getQueue(1: string queue)
      throws (1: TQueueNotFound notFound, 2: TIOError io, 3: TNotAuthorized denied, 4: TInvalidMessage invalid)
  void truncateQueue(1: string queue)
      throws (1: TQueueNotFound notFound, 2: TIOError io, 3: TNotAuthorized denied, 4: TInvalidMessage invalid)
  void disableQueue(1: string queue)
      throws (1: TQueueNotFound notFound, 2: TIOError io, 3: TNotAuthorized denied, 4: TInvalidMessage invalid)
  void enableQueue(1: string queue)
      throws (1: TQueueNotFound notFound, 2: TIOError io, 3: TNotAuthorized denied, 4: TInvalidMessage invalid)
  // The queue must be disabled first, as in HBase.
  void dropQueue(1: string queue)
      throws (1: TQueueNotFound notFound, 2: TInvalidMessage invalid, 3: TIOError io, 4: TNotAuthorized denied)

  // -- subscriptions (SPEC C7); the seed's argument orders
  // Registers name on queue now, so nothing written after this call is missed.
  // An existing registration keeps its checkpoints; starts given move them.
  // topics and partitions may be null: all of them (topics empty too).
  // deadLetterAfter: how many times the subscriber may refuse a message before
  // it goes to the queue <queue>.dlq (same partition, topic and value);
  // unset or 0: retry forever. (Apache Thrift's compilers ignore `optional` in
  // argument lists: their C++ and Go clients send "", 0 or an empty list for an
  // argument left out, and the server takes each so, as unset, on every call.)
  // createOnly: register a new subscriber only (one registered already: SubscriberExists,
  // as TInvalidMessage, and nothing changed), as a starting instance does.
  void addSubscriber(1: string queue, 2: string name, 3: list<binary> topics,
                     4: list<TPartitionStart> partitions, 5: optional i32 deadLetterAfter,
                     6: optional bool createOnly)
      throws (1: TQueueNotFound notFound, 2: TInvalidMessage invalid, 3: TIOError io, 4: TNotAuthorized denied)
  void deleteSubscriber(1: string name, 2: string queue)
      throws (1: TSubscriberNotFound notFound, 2: TIOError io, 3: TNotAuthorized denied, 4: TQueueNotFound queueNotFound, 5: TInvalidMessage invalid)
  list<string> listSubscribers(1: string queue)
      throws (1: TQueueNotFound notFound, 2: TIOError io, 3: TNotAuthorized denied, 4: TInvalidMessage invalid)
  TSubscriberInfo describeSubscriber(1: string name, 2: string queue)
      throws (1: TSubscriberNotFound notFound, 2: TQueueNotFound queueNotFound, 3: TIOError io, 4: TNotAuthorized denied, 5: TInvalidMessage invalid)
  // partitionID -1: every partition. Replays from startID (inclusive).
  void setCheckpoint(1: string queue, 2: string name, 3: i16 partitionID, 4: TMessageID startID)
      throws (1: TSubscriberNotFound notFound, 2: TInvalidMessage invalid, 3: TIOError io, 4: TNotAuthorized denied, 5: TQueueNotFound queueNotFound)
  // Where subscribers announce themselves: "zk:<hosts>/<chroot>" (create the
  // ephemeral nodes there), or "server" (call subscriberHeartbeat).
  // Needs the consumer role on queue (only subscribers use it).
  string getCoordination(1: string queue)
      throws (1: TIOError io, 2: TNotAuthorized denied, 3: TInvalidMessage invalid)
  // Without ZooKeeper: "I am at address, taking these topics, proving pushes
  // with this key"; every second. The server checks the address (it must be
  // the calling host's, or in --subscriber-allow networks).
  void subscriberHeartbeat(1: string queue, 2: string name, 3: string address, 4: list<binary> topics,
                           5: TPushKey push)
      throws (1: TSubscriberNotFound notFound, 2: TIOError io, 3: TNotAuthorized denied, 4: TQueueNotFound queueNotFound,
              5: TInvalidMessage invalid)
  // With ZooKeeper, before announcing there: the server checks the address as
  // for a heartbeat and records it; servers push only to recorded addresses
  // (or ones in their --subscriber-allow networks).
  void approveSubscriberAddress(1: string queue, 2: string name, 3: string address, 4: TPushKey push)
      throws (1: TSubscriberNotFound notFound, 2: TIOError io, 3: TNotAuthorized denied, 4: TQueueNotFound queueNotFound,
              5: TInvalidMessage invalid)
  // push: the leaving instance's key; its presence ends only if it is still its own (an
  // instance replaced since must not end the new one's). Without it (an older subscriber): ends.
  void subscriberLeave(1: string queue, 2: string name, 3: TPushKey push)
      throws (1: TSubscriberNotFound notFound, 2: TIOError io, 3: TNotAuthorized denied, 4: TQueueNotFound queueNotFound, 5: TInvalidMessage invalid)

  // -- timer messages (SPEC X1); sent to the partition's owner --------------------

  /** Write a packed batch (as putPacked) as timers delivered at dueMillis; the
      timers' IDs are firstID and the count - 1 after it. With dues, each message
      has its own due time: dues holds one signed 64-bit little-endian epoch ms
      per message, in order (8 bytes each), and dueMillis is ignored (send the
      latest of them: a server that predates dues then fires none early); dues
      empty: none. */
  TPutResult scheduleTimers(1: string queue, 2: i16 partitionID, 3: binary messages, 4: i64 dueMillis,
                            5: optional binary dues, 6: optional TRequest request)
      throws (1: TQueueNotFound notFound, 2: TQueueDisabled disabled, 3: TInvalidMessage invalid,
              4: TNotPartitionOwner notOwner, 5: TIOError io, 6: TNotAuthorized denied)
  /** True if the timer was pending and is now cancelled; false if it fired or was cancelled. */
  bool cancelTimer(1: string queue, 2: TTimer timer)
      throws (1: TQueueNotFound notFound, 2: TInvalidMessage invalid, 3: TNotPartitionOwner notOwner,
              4: TIOError io, 5: TNotAuthorized denied)
  /** The partition's pending timers, earliest first (after the timer given, when one is):
      at most limit (1..10,000), and none after the one that brings their topics and values
      to 8 MiB (a shorter answer is not the end: ask again after its last). Any server of
      the store answers. */
  list<TPendingTimer> pendingTimers(1: string queue, 2: i16 partitionID, 3: i32 limit, 4: optional TTimer after)
      throws (1: TQueueNotFound notFound, 2: TInvalidMessage invalid, 3: TIOError io, 4: TNotAuthorized denied)
  /** How many timers the partition has pending, counted up to limit (1..10,001). */
  i32 countTimers(1: string queue, 2: i16 partitionID, 3: i32 limit)
      throws (1: TQueueNotFound notFound, 2: TInvalidMessage invalid, 3: TIOError io, 4: TNotAuthorized denied)
  /** The due time (epoch ms) of the partition's earliest pending timer; -1 if none is pending. */
  i64 nextTimer(1: string queue, 2: i16 partitionID)
      throws (1: TQueueNotFound notFound, 2: TInvalidMessage invalid, 3: TIOError io, 4: TNotAuthorized denied)
  /** The pending timer with its message (one element), or none if it fired or was cancelled. */
  list<TPendingTimer> findTimer(1: string queue, 2: TTimer timer)
      throws (1: TQueueNotFound notFound, 2: TInvalidMessage invalid, 3: TIOError io, 4: TNotAuthorized denied)

  // -- consumer groups (SPEC X2, X3) -------------------------------------------------
  // A member calls groupReceive on every server (each serves the partitions it
  // owns) and sends acks and nacks to each partition's owner.

  /** Make the group if it is new (topics null or empty: all; startMillis 0: the
      beginning). keyAffinity "topic" or "partition": the group hands each key's
      messages out in order, one member at a time (null or "": as the group is;
      none for a new one). */
  void openGroup(1: string queue, 2: string group, 3: list<binary> topics, 4: i64 startMillis, 5: i32 maxRetries,
                 6: string keyAffinity)
      throws (1: TQueueNotFound notFound, 2: TInvalidMessage invalid, 3: TIOError io, 4: TNotAuthorized denied)
  TDeliveries groupReceive(1: string queue, 2: string group, 3: string member, 4: i32 maxMessages,
                               5: i32 leaseMillis, 6: i32 waitMillis)
      throws (1: TQueueNotFound notFound, 2: TQueueDisabled disabled, 3: TInvalidMessage invalid,
              4: TGroupNotFound groupNotFound, 5: TIOError io, 6: TNotAuthorized denied)
  /** rowkeys: the received messages' 12-byte rowkeys (SPEC C1: pid, timestamp,
      sequence, big-endian), concatenated. Returns how many were still open. */
  i32 groupAck(1: string queue, 2: string group, 3: binary rowkeys)
      throws (1: TQueueNotFound notFound, 2: TInvalidMessage invalid, 3: TNotPartitionOwner notOwner,
              4: TGroupNotFound groupNotFound, 5: TIOError io, 6: TNotAuthorized denied)
  /** groupAck, then groupReceive without waiting, in one call: a member's ack asks for its
      next batch (a prefetching client's, when one server owns the queue's partitions).
      The answer's acked is the ack's count. The receive's arguments are checked before
      the ack; once the ack is done, a receive that fails (the queue disabled meanwhile,
      say) answers no messages, and the member's next receive meets the error. */
  TDeliveries groupAckReceive(1: string queue, 2: string group, 3: string member, 4: binary rowkeys,
                              5: i32 maxMessages, 6: i32 leaseMillis)
      throws (1: TQueueNotFound notFound, 2: TInvalidMessage invalid, 3: TNotPartitionOwner notOwner,
              4: TGroupNotFound groupNotFound, 5: TIOError io, 6: TNotAuthorized denied)
  /** delayMillis -1: the backoff (1 s doubling per failure, at most 10 minutes); -2: handed back
      unseen (a cancelled receive's): to the group at once, not counted as a failed delivery. */
  i32 groupNack(1: string queue, 2: string group, 3: string member, 4: binary rowkeys, 5: i32 delayMillis)
      throws (1: TQueueNotFound notFound, 2: TInvalidMessage invalid, 3: TNotPartitionOwner notOwner,
              4: TGroupNotFound groupNotFound, 5: TIOError io, 6: TNotAuthorized denied,
              7: TQueueDisabled disabled)
  /** Move the messages to <queue>.dlq now, whatever their retries (made here if
      missing: the caller needs no admin right), and finish them. Every message
      the group has not finished counts, whoever holds it; returns how many.
      notOwner also while the dead-letter queue's partitions are not served
      yet: try again. */
  i32 groupDeadLetter(1: string queue, 2: string group, 3: string member, 4: binary rowkeys)
      throws (1: TQueueNotFound notFound, 2: TInvalidMessage invalid, 3: TNotPartitionOwner notOwner,
              4: TGroupNotFound groupNotFound, 5: TIOError io, 6: TNotAuthorized denied,
              7: TQueueDisabled disabled)
  void groupLeave(1: string queue, 2: string group, 3: string member)
      throws (1: TQueueNotFound notFound, 2: TGroupNotFound groupNotFound, 3: TIOError io, 4: TNotAuthorized denied, 5: TInvalidMessage invalid)
  /** Renew the leases the member holds of these messages (rowkeys as in groupAck):
      each runs leaseMillis from now, at most the server's --max-lease. Leases
      that ran out, went to another member or were finished are not renewed.
      Returns how many were. */
  i32 groupExtend(1: string queue, 2: string group, 3: string member, 4: binary rowkeys, 5: i32 leaseMillis)
      throws (1: TQueueNotFound notFound, 2: TInvalidMessage invalid, 3: TNotPartitionOwner notOwner,
              4: TGroupNotFound groupNotFound, 5: TIOError io, 6: TNotAuthorized denied)
  /** The member is still there. One silent past the server's --member-timeout
      (or whose last connection to this server closed) is gone: its leases end. */
  void groupHeartbeat(1: string queue, 2: string group, 3: string member)
      throws (1: TQueueNotFound notFound, 2: TGroupNotFound groupNotFound, 3: TIOError io, 4: TNotAuthorized denied,
              5: TInvalidMessage invalid)
  list<string> listGroups(1: string queue)
      throws (1: TQueueNotFound notFound, 2: TIOError io, 3: TNotAuthorized denied, 4: TInvalidMessage invalid)
  TGroupInfo describeGroup(1: string queue, 2: string group)
      throws (1: TQueueNotFound notFound, 2: TGroupNotFound groupNotFound, 3: TIOError io, 4: TNotAuthorized denied, 5: TInvalidMessage invalid)
  /** The group's messages in flight on the partitions this server owns, in (partition, ID) order, at most limit (1..10000). */
  list<TPending> groupPending(1: string queue, 2: string group, 3: i32 limit)
      throws (1: TQueueNotFound notFound, 2: TGroupNotFound groupNotFound, 3: TInvalidMessage invalid,
              4: TIOError io, 5: TNotAuthorized denied)
  /** Replay (or skip): the group takes partitionID again from startID (sent to the partition's owner). */
  void setGroupPosition(1: string queue, 2: string group, 3: i16 partitionID, 4: TMessageID startID)
      throws (1: TQueueNotFound notFound, 2: TGroupNotFound groupNotFound, 3: TInvalidMessage invalid,
              4: TNotPartitionOwner notOwner, 5: TIOError io, 6: TNotAuthorized denied)
  void deleteGroup(1: string queue, 2: string group)
      throws (1: TQueueNotFound notFound, 2: TGroupNotFound groupNotFound, 3: TIOError io, 4: TNotAuthorized denied, 5: TInvalidMessage invalid)
}

// Served by each subscriber (SPEC C7): the server pushes batches to it.
// Returns 0 when the batch was processed; any other value asks for a retry:
// 1 a listener failed (counts toward addSubscriber's deadLetterAfter),
// 2 the subscriber is stopping (never counts).
// Every push is proven (hqueue/subscriptions/push.py): the server asks a fresh
// challenge once per connection, then each push carries a TPushProof whose
// mac is HMAC-SHA256 with the key the subscriber announced. A push that is
// unproven, replayed or not of the subscription gets TPushRefused.
// consumePacked is the same push as one packed blob (the layout of putPacked's,
// each key a message's 12-byte rowkey then its topic): the server's first choice;
// it falls back to consumeMessages for a subscriber that does not know it. Its
// mac covers the blob as sent (push.py: mac_packed).
service HQueueSubscriberService {
  binary pushChallenge()
  i32 consumeMessages(1: list<TMessage> messages, 2: TPushProof proof)
      throws (1: TPushRefused refused)
  i32 consumePacked(1: binary messages, 2: TPushProof proof)
      throws (1: TPushRefused refused)
}
