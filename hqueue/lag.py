"""How far a reader is behind in a partition (SPEC X6): in messages and in time.

Two ways to know it:

* :func:`partition_lag` counts the rows (``describe`` of a group);
* :class:`LagBook` keeps the counts as things move, so that a metrics scrape
  reads no row and costs O(series) however far behind readers are.

The book keeps, per partition this process writes, a :class:`Tally` of the
messages appended since it began counting (in all, and per topic some
reader filters on), the last ID written and the first and last IDs of the
recent batches. A *reader* (a consumer group over a partition, or a push
subscriber's worker) keeps its cursor and a count of what it finished
(acked, or delivered), as it moves. Once per reader, a background thread
counts the rows from the reader's cursor to the partition's end, and
remembers that count as a :class:`Seed`, with the tally's and the reader's
counts then. From there::

    lag = seed.count + (tally now - tally then) - (finished now - finished then)

The seeding thread works at most a quarter of the time (it sleeps three
times as long as each chunk of 10,000 rows took), so readers made in bulk
cost the server a bounded share of one core, never a scrape's time.

What is approximate, and bounded:

* a seed counts at most ``LAG_COUNT_LIMIT`` (100,000) rows: a reader
  further behind shows at least 100,000, and is counted again whenever its
  lag falls under half that, so the count stays a lower bound that becomes
  exact below 50,000 (at most two rows counted per message finished);
* messages that expire (TTL) while waiting are counted again once the
  oldest message counted has expired, by the scrape that sees it (it waits
  for the count, as for a first one: :meth:`LagBook.wait_counted`), at most
  every ``EXPIRED_RECOUNT`` seconds a reader: until then the count still
  holds them, and the age is at most the TTL;
* the age of the oldest waiting message is exact for the last 4,096 batches
  written (for a reader with a topic filter, the last TOPIC_MARKS batches of
  each of its topics, for TOPIC_MARKED topics a partition; else of any topic);
  for a reader further back it is a bound from above: the age of its cursor,
  or of the oldest message it had waiting when it was counted, the younger.
"""

from __future__ import annotations

import logging
import threading
import time
from bisect import bisect_left
from collections import Counter
from collections.abc import Callable, Collection, Iterable, Sequence
from dataclasses import dataclass, field
from itertools import chain
from typing import TYPE_CHECKING, Any, NamedTuple

from .errors import HQueueError
from .ids import runs, wall_clock_ms
from .message import MessageID, id_bytes, successor
from .scanner import Scan
from .storage.base import ttl_cutoff

if TYPE_CHECKING:
    from .engine import Engine

logger = logging.getLogger(__name__)

#: Metrics count lag messages exactly up to this many per partition (a seed must stay cheap).
LAG_COUNT_LIMIT = 100_000
#: Rows read per call while counting.
_CHUNK = 10_000
#: Batches whose first and last IDs a tally keeps (ages of the messages written since).
MARKS = 4096
#: Of each topic a reader filters on, batches with it whose first and last IDs a tally keeps,
#: for this many topics a partition at most (others' ages are those of any topic: a bound).
TOPIC_MARKS = 64
TOPIC_MARKED = 32
#: The seeding thread works this share of the time at most.
DUTY = 0.25
#: A reader counted this many seconds ago or more is counted again once messages it counted
#: have expired (TTL): one that stays behind on a queue whose messages expire all the time is
#: counted at most this often, not at every scrape.
EXPIRED_RECOUNT = 5.0

#: How many messages from a given ID on (10 bytes: the first one still stored) a reader has
#: finished ahead of its cursor. Those before it are no longer stored (expired, truncated): they
#: are not among the rows counted, so they are not taken off the count (a group with one message
#: stuck and the 99 after it acked showed a lag of 0 once those expired, with 50 new ones waiting).
Ahead = Callable[[bytes], int]
#: What a reader tells the seeding thread, read at one instant (under the reader's lock):
#: its cursor (a 10-byte ID), what it has finished so far, and what it finished ahead of the cursor.
Progress = Callable[[Any], tuple[bytes, int, Ahead]]


#: Above every ID (10 bytes): an :data:`Ahead` asked from it counts none of them.
_PAST_EVERY_ID = b"\xff" * 11


def none_ahead(first: bytes) -> int:
    """A reader that finishes in order (a subscriber): nothing ahead of its cursor."""
    return 0


def finished_ahead(finished: Iterable[bytes], less: int = 0) -> Ahead:
    """The :data:`Ahead` of these IDs finished ahead of a cursor, less ``less`` (unfinished
    ones the cursor moved past: lag). Called under the reader's lock, it only copies them:
    they are sorted when first asked, outside it (a key-ordered group may hold a million)."""
    ids, ordered = list(finished), list[bytes]()

    def ahead(first: bytes) -> int:
        if len(ordered) != len(ids):
            ordered[:] = sorted(ids)
        return len(ids) - bisect_left(ordered, first) - less

    return ahead


def partition_lag(
    engine: Engine,
    queue: str,
    partition_id: int,
    checkpoint: MessageID,
    topics: frozenset[bytes] | None,
    limit: int | None = LAG_COUNT_LIMIT,
    ahead: Ahead = none_ahead,
) -> tuple[int, int]:
    """How far a reader is behind in a partition: (messages at or after
    ``checkpoint``, counted up to ``limit``, None: all of them, less those the reader
    finished ahead of it (``ahead``); milliseconds since the oldest of them was written).
    Never negative. Expired (TTL) and truncated messages are not counted."""
    last = engine.last_id(queue, partition_id)
    if last is None or last < checkpoint:
        return 0, 0
    count, oldest = count_rows(engine, queue, partition_id, checkpoint, last, topics, limit)
    if oldest is None:
        return 0, 0
    return max(0, count - ahead(oldest.to_bytes())), max(0, wall_clock_ms() - oldest.timestamp)


def count_rows(
    engine: Engine,
    queue: str,
    partition_id: int,
    start: MessageID,
    last: MessageID,
    topics: Collection[bytes] | None,
    limit: int | None,
    pause: Callable[[float], None] | None = None,
) -> tuple[int, MessageID | None]:
    """(messages from ``start`` to ``last`` included, up to ``limit``; the first of them).
    ``pause(seconds the chunk took)`` is called after each chunk read."""
    scan = Scan(start, successor(last), frozenset(topics) if topics is not None else None)
    begin, stop = scan.key_range(partition_id)
    count, oldest = 0, None
    while limit is None or count < limit:
        asked = _CHUNK if limit is None else min(_CHUNK, limit - count)
        started = time.perf_counter()
        keys, _ = engine.scan_columns(queue, begin, stop, scan.topics, asked)
        if pause is not None:
            pause(time.perf_counter() - started)
        if not keys:
            break
        if oldest is None:
            oldest = MessageID.from_bytes(id_bytes(keys[0]))
        count += len(keys)
        if len(keys) < asked:
            break
        begin = keys[-1] + b"\x00"
    return count, oldest


class Marks:
    """The first and last IDs (10 bytes) of the recent batches of a partition, or of one
    topic's messages in it, and the ID above which every batch written is among them.

    Replaced whole when trimmed and appended firsts before lasts, so that a reader without
    the lock sees lasts no longer than firsts and a floor no higher than what they hold."""

    __slots__ = ("firsts", "lasts", "floor")

    def __init__(self, floor: bytes | None, firsts: list[bytes] | None = None, lasts: list[bytes] | None = None):
        self.firsts: list[bytes] = firsts if firsts is not None else []
        self.lasts: list[bytes] = lasts if lasts is not None else []
        #: Every batch with IDs above it is here (b"": every batch); None: unknown below the first.
        self.floor = floor

    def add(self, first: bytes, last: bytes, keep: int) -> Marks:
        """Itself with a batch more, or (past ``keep``) a copy of its newer half with it."""
        marks = self
        if len(self.lasts) >= keep:
            half = keep // 2
            marks = Marks(self.lasts[half - 1], self.firsts[half:], self.lasts[half:])
        marks.firsts.append(first)
        marks.lasts.append(last)
        return marks

    def first_from(self, cursor: bytes, last: bytes | None) -> bytes | None:
        """The first ID at or after ``cursor`` (``last``: the last one written): b"" when there
        is none, None when it is older than the batches kept."""
        lasts, firsts, floor = self.lasts, self.firsts, self.floor
        index = bisect_left(lasts, cursor)
        if index == len(lasts):
            return b"" if last is None or cursor > last or (floor is not None and cursor > floor) else None
        first = firsts[index]
        if cursor >= first:
            return cursor  # inside a batch: its IDs are consecutive (of a topic's: a bound, of the same ms)
        # (before the first kept: nothing between the cursor and it if the cursor is past the floor)
        return first if index > 0 or (floor is not None and cursor > floor) else None


class Tally:
    """What this process appended to one partition since it began counting (kept under
    the partition's write lock, so it never runs ahead of what readers can see).

    Args:
        last: The last message ID written (10-byte form), None for an empty partition.
        floor: The ID after which this tally sees every batch (b"": all of them); None when
            it is not known (a tally begun by an append: what came before it is not).
    """

    def __init__(self, last: bytes | None, floor: bytes | None = None) -> None:
        self.lock = threading.Lock()
        #: False once the book forgot it (ownership moved, a truncate): its seeds are stale.
        self.live = True
        self.total = 0
        #: Per topic some reader filters on, from when it began to.
        self.by_topic: dict[bytes, int] = {}
        #: The last message ID written (10-byte form), None for an empty partition.
        self.last = last
        #: The recent batches, and (for up to TOPIC_MARKED topics readers filter on) each
        #: topic's: the age of a filtering reader's oldest waiting message is its topics'.
        self._marks = Marks(floor)
        self._by_topic_marks: dict[bytes, Marks] = {}

    def add(self, first: MessageID, topics: Sequence[bytes]) -> None:
        timestamp, sequences = runs(first, len(topics))[-1]
        last = MessageID(timestamp, sequences[-1]).to_bytes()
        first_bytes = first.to_bytes()
        with self.lock:
            self.total += len(topics)
            if self.by_topic:
                for topic, count in Counter(topics).items():
                    if topic in self.by_topic:
                        self.by_topic[topic] += count
                        marks = self._by_topic_marks.get(topic)
                        if marks is not None:
                            self._by_topic_marks[topic] = marks.add(first_bytes, last, TOPIC_MARKS)
            self._marks = self._marks.add(first_bytes, last, MARKS)
            self.last = last

    def watch(self, topics: Collection[bytes]) -> None:
        """Count these topics from now on (and mark their batches, for the first TOPIC_MARKED)."""
        with self.lock:
            # (every later batch is marked; begun by an append whose add is still to come, what
            # came before is not known: the partition's floor, None)
            floor = self.last if self.last is not None else self._marks.floor
            for topic in topics:
                self.by_topic.setdefault(topic, 0)
                if topic not in self._by_topic_marks and len(self._by_topic_marks) < TOPIC_MARKED:
                    self._by_topic_marks[topic] = Marks(floor)

    def count(self, topics: Collection[bytes] | None) -> int:
        if topics is None:
            return self.total
        by_topic = self.by_topic
        return sum(by_topic.get(t, 0) for t in topics)

    def first_from(self, cursor: bytes, topics: Collection[bytes] | None = None) -> bytes | None:
        """The first message ID at or after ``cursor`` (of ``topics``; None: any): b"" when
        there is none, None when it is older than the batches kept. Without the lock (a scrape).
        Of topics not all marked, or marked less far back, that of any topic (a bound)."""
        last = self.last
        if topics is not None:
            found = []
            for topic in topics:
                marks = self._by_topic_marks.get(topic)
                first = marks.first_from(cursor, last) if marks is not None else None
                if first is None:
                    break
                found.append(first)
            else:
                ids = [f for f in found if f]
                if ids:  # (none of those topics: the count says otherwise, so any topic's, a bound)
                    return min(ids)
        return self._marks.first_from(cursor, last)


class Lag(NamedTuple):
    """A reader's lag in one partition (:meth:`LagBook.lag`)."""

    #: Messages not yet finished.
    messages: int
    #: When the oldest of them was written (ms since the epoch; 0: none waits, or unknown).
    oldest_ms: int
    #: False when the book asked for a recount: the next answer may differ.
    settled: bool

    def age(self, now_ms: int) -> float:
        """Seconds since the oldest waiting message was written (0.0 when none waits)."""
        return max(0.0, (now_ms - self.oldest_ms) / 1000) if self.oldest_ms else 0.0


@dataclass(slots=True, eq=False)
class Seed:
    """A reader's lag counted once, with the counts it is measured from."""

    tally: Tally
    count: int
    base: int
    finished: int
    oldest: bytes
    saturated: bool
    #: The reader's cursor it was counted from.
    cursor: bytes = b""
    #: When it was counted (``time.monotonic``).
    made: float = field(default_factory=time.monotonic)


class LagBook:
    """Lag per reader, kept as things move (see the module's docstring).

    Args:
        engine: The engine whose writes are counted.
        limit: The most rows one seed counts.
    """

    def __init__(self, engine: Engine, *, limit: int = LAG_COUNT_LIMIT) -> None:
        self.engine, self.limit = engine, limit
        self._tallies: dict[tuple[str, int], Tally] = {}
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)
        #: Notified when a reader was counted or a refresh done (what wait_counted waits on).
        self._counted = threading.Condition(self._lock)
        self._current: Any = None
        self._refreshes = 0
        #: Refreshes asked for (partitions gained or lost: load what is owned now, before
        #: counting more), and how many of those asks the last refresh done answered.
        self._asked = self._answered = 0
        #: Readers waiting to be counted, oldest first: id -> (reader, queue, pid, topics, progress).
        self._pending: dict[int, tuple[Any, str, int, frozenset[bytes] | None, Progress]] = {}
        #: Readers (ids) pending or being counted whose last answer is known wrong (messages it
        #: counted expired, or its count fell below what it can be): a scrape waits for them too.
        self._recounting: set[int] = set()
        self._refreshers: list[Callable[[], None]] = []
        self.refresh_interval = 10.0
        self._stopped = False
        self._thread = threading.Thread(target=self._run, name="hqueue-lag", daemon=True)
        engine.events.on_append(self._appended)
        engine.events.on_truncate(self.forget_queue)
        engine.events.on_drop(self.forget_queue)

    def start(self) -> LagBook:
        self._thread.start()
        return self

    def stop(self) -> None:
        with self._wake:
            self._stopped = True
            self._wake.notify_all()
        if self._thread.is_alive():
            self._thread.join(timeout=10)

    def on_refresh(self, refresher: Callable[[], None]) -> None:
        """Call ``refresher()`` from the book's thread every ``refresh_interval`` seconds
        (the group service loads every group there, so metrics cover them all)."""
        self._refreshers.append(refresher)

    # -- tallies ----------------------------------------------------------------------------

    def _appended(self, queue: str, pid: int, first: MessageID, topics: Sequence[bytes]) -> None:
        tally = self._tallies.get((queue, pid))
        if tally is None:  # under the write lock: no append can come between
            with self._lock:
                tally = self._tallies.setdefault((queue, pid), Tally(None))  # (floor unknown)
        tally.add(first, topics)

    def _tally(self, queue: str, pid: int) -> Tally:
        """The partition's tally, begun now if there is none (one read of its last row)."""
        tally = self._tallies.get((queue, pid))
        if tally is None:
            with self.engine.writers.lock(queue, pid):  # no append between the read and the tally
                last = self.engine.last_id(queue, pid)
                with self._lock:
                    known = last.to_bytes() if last else None
                    tally = self._tallies.setdefault((queue, pid), Tally(known, known or b""))
        return tally

    def forget(self, partitions: Collection[tuple[str, int]]) -> None:
        """Partitions gained or lost: others may write them meanwhile; count them afresh,
        and refresh at once (what a server gains has series from then on)."""
        with self._lock:
            for key in partitions:
                tally = self._tallies.pop(key, None)
                if tally is not None:
                    tally.live = False
            self._asked += 1
            self._wake.notify()

    def forget_queue(self, queue: str) -> None:
        with self._lock:
            for key in [k for k in self._tallies if k[0] == queue]:
                self._tallies.pop(key).live = False

    # -- what a scrape reads ------------------------------------------------------------------

    def lag(
        self,
        reader: Any,
        queue: str,
        pid: int,
        topics: frozenset[bytes] | None,
        cursor: bytes,
        finished: int,
        progress: Progress,
    ) -> Lag | None:
        """The reader's messages not yet finished and when the oldest was written, from
        counts kept: no row is read. None until the reader has been counted once
        (``reader.lag_seed``, set by the book's thread, which this asks for with
        ``progress(reader)``).

        The answer changes only when the reader's live seed (compared by identity),
        the partition's ``Tally.total``, ``cursor`` or ``finished`` do, unless it is not
        ``settled`` (a recount was asked for): a scrape may keep what it rendered."""
        seed: Seed | None = reader.lag_seed
        if seed is None or not seed.tally.live:
            self._request(reader, queue, pid, topics, progress)
            return None
        tally = seed.tally
        written = tally.total if topics is None else tally.count(topics)
        value = seed.count + written - seed.base - (finished - seed.finished)
        last = tally.last
        if last is None or cursor > last:  # at the end: nothing waits
            if value:
                self._request(reader, queue, pid, topics, progress)  # expired messages counted: afresh
                return Lag(0, 0, False)
            return Lag(0, 0, True)
        settled = True
        if value < 0 or (seed.saturated and value < self.limit // 2):
            self._request(reader, queue, pid, topics, progress, wrong=True)
            value, settled = max(value, 0), False
        if value == 0:
            return Lag(0, 0, settled)
        # From a cursor at or past the one the seed counted from, no message waiting is older
        # than the oldest it counted (those after it were written later): with the tally's first
        # from the cursor, the nearer of the two bounds (of any topic, the tally's may be another
        # topic's, written long before). A cursor before it (a group's stuck message, which its
        # count skipped) bounds it alone.
        counted = seed.oldest if cursor >= seed.cursor else b""
        first = tally.first_from(cursor, topics)
        if first is None:
            first = max(cursor, counted)
        elif first:
            first = max(first, counted)
        alive = self._oldest_alive(queue)
        if alive is not None:
            # Messages expire as time goes (TTL): this answer may change with nothing moving.
            settled = False
            if first < alive:  # the oldest waiting, as far as the tally knows, has expired
                if seed.oldest >= alive:  # none counted has: the seed's oldest is the oldest waiting
                    first = seed.oldest
                else:  # some counted have: counted again (the oldest waiting is no older than the TTL)
                    if time.monotonic() - seed.made >= EXPIRED_RECOUNT:
                        self._request(reader, queue, pid, topics, progress, wrong=True)
                    first = alive
        return Lag(value, int.from_bytes(first[:8], "big") if first else 0, settled)

    def _oldest_alive(self, queue: str) -> bytes | None:
        """The oldest ID (10 bytes) ``queue``'s TTL still keeps; None without a TTL."""
        try:
            cutoff = ttl_cutoff(self.engine.queue_info(queue))
        except HQueueError:
            return None
        return cutoff.to_bytes() if cutoff is not None else None

    def pending(self) -> int:
        """Readers waiting to be counted."""
        return len(self._pending)

    def wait_counted(self, timeout: float) -> bool:
        """Wait at most ``timeout`` seconds until the first refresh is done, every reader
        asked about has been counted once (so a scrape shows all their series), and every
        one whose answer was known wrong has been counted again (``_request(wrong=True)``)."""
        deadline = time.monotonic() + timeout
        with self._counted:
            while not self._all_counted():
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._counted.wait(left)
            return True

    def _all_counted(self) -> bool:
        if self._refreshes == 0 or self._asked != self._answered:
            return False
        if self._recounting:  # (those no longer pending nor being counted were counted)
            current = id(self._current) if self._current is not None else None
            self._recounting = {i for i in self._recounting if i in self._pending or i == current}
            if self._recounting:
                return False
        readers = chain((job[0] for job in self._pending.values()), (self._current,))  # stops at the first
        return all(r is None or (r.lag_seed and r.lag_seed.tally.live) for r in readers)

    def _request(
        self,
        reader: Any,
        queue: str,
        pid: int,
        topics: frozenset[bytes] | None,
        progress: Progress,
        wrong: bool = False,
    ) -> None:
        """Count ``reader`` (again) in the book's thread; ``wrong``: its answer now is known to
        be wrong, and a scrape waits for the count (wait_counted), as for a first one."""
        with self._wake:
            if wrong:
                self._recounting.add(id(reader))
            if id(reader) not in self._pending:
                self._pending[id(reader)] = (reader, queue, pid, topics, progress)
                self._wake.notify()

    # -- the book's thread ---------------------------------------------------------------------

    def _run(self) -> None:
        refreshed = 0.0
        while True:
            with self._wake:
                while not self._stopped and not self._pending and self._asked == self._answered:
                    left = refreshed + self.refresh_interval - time.monotonic()
                    if left <= 0:
                        break
                    self._wake.wait(left)
                if self._stopped:
                    return
                asked = self._asked
                job = (
                    self._pending.pop(next(iter(self._pending))) if self._pending and asked == self._answered else None
                )
                self._current = job[0] if job else None
            if job is None:
                refreshed = time.monotonic()
                self._refresh()
            else:
                try:
                    self._seed(*job)
                except Exception:  # one reader's count never stops the others'
                    logger.debug("counting the lag of %s partition %d failed", job[1], job[2], exc_info=True)
                    self._pause(0.05)
            with self._counted:
                self._current = None
                if job is None:
                    self._refreshes, self._answered = self._refreshes + 1, asked
                self._counted.notify_all()

    def _refresh(self) -> None:
        for refresher in self._refreshers:
            try:
                refresher()
            except Exception:
                logger.warning("refreshing what lag metrics cover failed", exc_info=True)

    def _pause(self, worked: float) -> None:
        """Sleep so that counting takes at most DUTY of the time (a stop cuts it short)."""
        with self._wake:
            if not self._stopped:
                self._wake.wait(worked * (1 - DUTY) / DUTY)

    def _seed(self, reader: Any, queue: str, pid: int, topics: frozenset[bytes] | None, progress: Progress) -> None:
        tally = self._tally(queue, pid)
        if topics is not None:
            tally.watch(topics)
        with tally.lock:
            base, last = tally.count(topics), tally.last
        cursor, finished, ahead = progress(reader)
        extra = max(0, ahead(cursor))  # (all of them: count past them)
        count, oldest = 0, None
        if last is not None and cursor <= last:
            count, oldest = count_rows(
                self.engine,
                queue,
                pid,
                MessageID.from_bytes(cursor),
                MessageID.from_bytes(last),
                topics,
                self.limit + extra,
                self._pause,
            )
        saturated = count >= self.limit + extra
        oldest_bytes = oldest.to_bytes() if oldest is not None else b""
        # (none there: none of those acked ahead is either; those behind the cursor still count)
        unfinished = max(0, count - ahead(oldest_bytes if oldest is not None else _PAST_EVERY_ID))
        reader.lag_seed = Seed(tally, unfinished, base, finished, oldest_bytes, saturated, cursor)
