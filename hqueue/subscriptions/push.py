"""The push channel's guard (SPEC C7, "The push channel"): servers prove every
push, subscribers check it, and pushes travel encrypted when asked.

A subscriber listens on a port of its own, so anyone who can reach that
port could call ``consumePacked``. Each time it starts, a subscriber
makes a :class:`PushCredentials`: a random 256-bit key and, when it listens
with TLS, the SHA-256 fingerprint of a certificate made for this run
(:func:`ephemeral_tls`). It announces them with its address, to the server
(heartbeats) or in ZooKeeper (an ephemeral node under the servers' ACL),
never anywhere a client token can read.

On every connection the server first asks ``pushChallenge()`` for a fresh
random challenge, and proves the key with a push of no messages: until a
connection has, the subscriber takes no call over 4 KiB from it (a
stranger's big frames, sent slowly, held its memory). Each push then
carries a :class:`TPushProof`: queue,
subscriber, partition, the registration's epoch, a sequence number that
grows on the connection, and an HMAC-SHA256 with the key over all of it and
over every message's ID, topic and value. :class:`PushGuard` (the
subscriber's side) refuses with ``TPushRefused`` (the listeners never see
the batch) a push without a challenge or proof, with a bad MAC, a sequence
not above the last, another queue or subscriber, a partition the
queue does not have, messages of another partition or IDs not
increasing, an older epoch, or a batch that starts below the one before it
in the same epoch (a retry repeats a batch; it never goes back). A replayed
push fails the sequence check, and a push recorded on another connection
fails the challenge.

With TLS, the server pins the certificate: it connects without a CA and
refuses a peer whose certificate's fingerprint is not the announced one.
"""

from __future__ import annotations

import contextlib
import datetime
import hashlib
import hmac
import operator
import secrets
import ssl
import struct
import tempfile
import threading
from collections.abc import Collection, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..auth import PushCredentials
from ..errors import HQueueError, InvalidArgument
from ..message import id_bytes
from ..rpc import packed

__all__ = [
    "PushCredentials", "PushGuard", "PushRefused", "check_pin", "ephemeral_tls", "mac", "mac_packed", "pinned_context",
]  # fmt: skip

#: Most messages one push may carry (the server sends up to its batch size, 1,000 by default).
MAX_PUSH_MESSAGES = 10_000

_HEADER = struct.Struct(">16sqqh")  # challenge, sequence, epoch, partition
_MESSAGE = struct.Struct(">qhII")  # timestamp, sequence ID, topic and value lengths
_PID = struct.Struct(">H")  # a rowkey's partition
_ID_PARTS = struct.Struct(">QH")  # a message ID's 10 bytes: timestamp, sequence
_PARTITION = operator.itemgetter(slice(0, 2))


class PushRefused(HQueueError):
    """A push the subscriber refused: unproven, replayed, or not of its subscription."""


def fingerprint(der: bytes) -> str:
    return hashlib.sha256(der).hexdigest()


def _headed(
    domain: bytes, key: bytes, challenge: bytes, sequence: int, epoch: int, queue: str, subscriber: str, pid: int
) -> Any:
    """An HMAC-SHA256 with ``key``, fed the push's domain and header."""
    h = hmac.new(key, domain, hashlib.sha256)
    h.update(_HEADER.pack(challenge, sequence, epoch, pid))
    for text in (queue, subscriber):
        raw = text.encode("utf-8")
        h.update(struct.pack(">I", len(raw)) + raw)
    return h


def mac(
    key: bytes,
    challenge: bytes,
    sequence: int,
    epoch: int,
    queue: str,
    subscriber: str,
    partition_id: int,
    messages: Sequence[Any],
) -> bytes:
    """The HMAC-SHA256 a push (``consumeMessages``) carries: over the header and every
    message's ID, topic and value."""
    h = _headed(b"hqueue-push-1\0", key, challenge, sequence, epoch, queue, subscriber, partition_id)
    h.update(struct.pack(">I", len(messages)))
    for m in messages:
        topic, value = m.topic or b"", m.value or b""
        h.update(_MESSAGE.pack(m.id.timestamp, m.id.sequenceID or 0, len(topic), len(value)))
        h.update(topic)
        h.update(value)
    return h.digest()


def mac_packed(
    key: bytes,
    challenge: bytes,
    sequence: int,
    epoch: int,
    queue: str,
    subscriber: str,
    partition_id: int,
    blob: bytes,
) -> bytes:
    """The HMAC-SHA256 a packed push (``consumePacked``) carries: over the header and the
    blob as sent (its own domain, so neither kind of proof passes for the other)."""
    h = _headed(b"hqueue-push-packed-1\0", key, challenge, sequence, epoch, queue, subscriber, partition_id)
    h.update(blob)
    return h.digest()


@dataclass
class _ConnectionState:
    challenge: bytes
    sequence: int = 0
    #: Per partition: (epoch, first ID of the last batch).
    positions: dict[int, tuple[int, tuple[int, int]]] = field(default_factory=dict)


class PushGuard:
    """The subscriber's check of each push (one per running subscriber).

    Args:
        credentials: The key (and certificate) this run announced.
        queue, subscriber: Whose pushes are accepted.
        partitions: The partitions pushes may be of (the queue's: the registration, which an
            admin may change while the subscriber runs, says which are).
    """

    def __init__(self, credentials: PushCredentials, queue: str, subscriber: str, partitions: Collection[int]) -> None:
        self.credentials, self.queue, self.subscriber = credentials, queue, subscriber
        self.partitions = frozenset(partitions)
        #: Pushes refused so far.
        self.refused = 0
        self._lock = threading.Lock()

    def challenge(self, connection: Any) -> bytes:
        """A fresh challenge for ``connection`` (it restarts the sequence)."""
        challenge = secrets.token_bytes(16)
        connection.push = _ConnectionState(challenge)
        return challenge

    def check(self, connection: Any, messages: Sequence[Any], proof: Any) -> None:
        """Raise PushRefused unless the push (``consumeMessages``) is proven, fresh and of this subscription."""
        with self._counted():
            state = self._state(connection, proof)
            if len(messages) > MAX_PUSH_MESSAGES:
                raise PushRefused(f"a push carries at most {MAX_PUSH_MESSAGES} messages, got {len(messages)}")
            if not all(m is not None and m.id is not None and isinstance(m.id.timestamp, int) for m in messages):
                raise PushRefused("every pushed message needs its ID")
            try:
                expected = mac(*self._header(state, proof), messages)
            except (TypeError, AttributeError, struct.error) as e:
                raise PushRefused(f"a malformed push: {e}") from None
            self._proven(expected, proof)
            if not messages:  # the server proving the key (see check_packed)
                self._advance(state, proof, None)
                return
            pid = proof.partitionID
            if any(m.partitionID not in (None, pid) for m in messages):
                raise PushRefused(f"a push for partition {pid} carries messages of another partition")
            ids = [(m.id.timestamp, m.id.sequenceID or 0) for m in messages]
            if any(a >= b for a, b in zip(ids, ids[1:], strict=False)):
                raise PushRefused("pushed message IDs must increase")
            self._advance(state, proof, ids[0])

    def check_packed(self, connection: Any, blob: Any, proof: Any) -> tuple[list[bytes], list[bytes]]:
        """The cell keys and values of a packed push (``consumePacked``), once it is proven,
        fresh and of this subscription; PushRefused if it is not. The proof is checked over
        the blob before anything of it is unpacked."""
        with self._counted():
            state = self._state(connection, proof)
            if not isinstance(blob, bytes):
                raise PushRefused("a packed push needs its messages")
            try:
                expected = mac_packed(*self._header(state, proof), blob)
            except (TypeError, AttributeError, struct.error) as e:
                raise PushRefused(f"a malformed push: {e}") from None
            self._proven(expected, proof)
            try:
                keys, values = packed.unpack_cells(blob)  # (every message with its 12-byte rowkey)
            except InvalidArgument as e:
                raise PushRefused(f"a malformed push: {e}") from None
            if len(keys) > MAX_PUSH_MESSAGES:
                raise PushRefused(f"a push carries at most {MAX_PUSH_MESSAGES} messages, got {len(keys)}")
            if not keys:  # the server proving the key before it sends more than a small call
                self._advance(state, proof, None)
                return keys, values
            pid = proof.partitionID
            if set(map(_PARTITION, keys)) != {_PID.pack(pid)}:
                raise PushRefused(f"a push for partition {pid} carries messages of another partition")
            ids = list(map(id_bytes, keys))  # 10 bytes each, which sort as the IDs do
            if not all(map(operator.lt, ids, ids[1:])):
                raise PushRefused("pushed message IDs must increase")
            self._advance(state, proof, _ID_PARTS.unpack(ids[0]))
            return keys, values

    @contextlib.contextmanager
    def _counted(self) -> Iterator[None]:
        """Count a refusal in :attr:`refused`."""
        try:
            yield
        except PushRefused:
            with self._lock:
                self.refused += 1
            raise

    @staticmethod
    def _state(connection: Any, proof: Any) -> _ConnectionState:
        state: _ConnectionState | None = getattr(connection, "push", None)
        if state is None:
            raise PushRefused("a push needs a challenge first (pushChallenge) on its connection")
        if proof is None or not isinstance(proof.mac, bytes) or not isinstance(proof.sequence, int):
            raise PushRefused("a push needs its proof")
        return state

    def _header(self, state: _ConnectionState, proof: Any) -> tuple[bytes, bytes, int, int, str, str, int]:
        """What a push's MAC covers before its messages."""
        return (
            self.credentials.key, state.challenge, proof.sequence, proof.epoch or 0,
            proof.queue or "", proof.subscriber or "", proof.partitionID,
        )  # fmt: skip

    def _proven(self, expected: bytes, proof: Any) -> None:
        """The MAC matches, and the push is of this subscription and not a replay."""
        if not hmac.compare_digest(expected, proof.mac):
            raise PushRefused("the push's proof does not match this subscriber's key")
        # Proven: what follows is a server's mistake or a replay, still never passed on.
        if (proof.queue, proof.subscriber) != (self.queue, self.subscriber):
            raise PushRefused(f"a push for {proof.subscriber!r} on {proof.queue!r}, not this subscriber")
        if proof.partitionID not in self.partitions:
            raise PushRefused(f"partition {proof.partitionID} is not one of this queue's")

    @staticmethod
    def _advance(state: _ConnectionState, proof: Any, first: tuple[int, int] | None) -> None:
        """Accept the push whose first message's ID is ``first`` (timestamp, sequence; None:
        a push of no messages, which proves the key): its sequence must be above the
        connection's last, and it must not go back."""
        if proof.sequence <= state.sequence:
            raise PushRefused(f"push sequence {proof.sequence} is not above {state.sequence}: a replay")
        if first is None:
            state.sequence = proof.sequence
            return
        pid, epoch = proof.partitionID, proof.epoch or 0  # as the MAC covers it
        before = state.positions.get(pid)
        if before is not None and (epoch < before[0] or (epoch == before[0] and first < before[1])):
            raise PushRefused(f"a push of partition {pid} goes back before the batch it sent before")
        state.sequence = proof.sequence
        state.positions[pid] = (epoch, first)


def ephemeral_tls() -> tuple[ssl.SSLContext, str]:
    """A server-side TLS context with a certificate made for this run, and its fingerprint.

    The certificate is self-signed (P-256, valid a year); nobody verifies it
    against a CA: servers pin its fingerprint, announced with the key.
    """
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "hqueue subscriber")])
    now = datetime.datetime.now(datetime.UTC)
    certificate = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=365))
        .sign(key, hashes.SHA256())
    )
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    # load_cert_chain reads files only: a private temporary file, deleted at once.
    with tempfile.NamedTemporaryFile(suffix=".pem") as pem:
        pem.write(certificate.public_bytes(serialization.Encoding.PEM))
        pem.write(
            key.private_bytes(
                serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
            )
        )
        pem.flush()
        context.load_cert_chain(pem.name)
    return context, fingerprint(certificate.public_bytes(serialization.Encoding.DER))


def pinned_context() -> ssl.SSLContext:
    """The server's client context for pushes: encryption, with the peer checked by its pin."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE  # no CA: check_pin() compares the fingerprint instead
    return context


def check_pin(sock: ssl.SSLSocket, expected: str) -> None:
    """Raise PushRefused unless the peer's certificate is the announced one."""
    der = sock.getpeercert(binary_form=True)
    if der is None or not hmac.compare_digest(fingerprint(der), expected):
        raise PushRefused("the subscriber's TLS certificate is not the one it announced")
