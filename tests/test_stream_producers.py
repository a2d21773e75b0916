"""Idempotent producers: duplicates dropped and confirmed, the state rebuilt from a snapshot
and the log after a restart, a failed write taken back, the state bounded."""

from __future__ import annotations

import asyncio

import pytest

from warrenmq.amqp import properties as props
from warrenmq.log import LogConfig, PartitionLog
from warrenmq.server.stream import producers
from warrenmq.server.stream.producers import ProducerSequences, producer_of
from warrenmq.server.stream.stream import Stream, StreamLog

NOW_MS = 1_700_000_000_000


def open_stream(directory) -> Stream:
    engine = StreamLog.open(directory / "s", LogConfig(), {})
    return Stream("/", "s", engine, arguments={}, effective_arguments={}, batch_records_max=64)


def message(producer: str | None, sequence: int | None, body: bytes = b"m"):
    entries = []
    if producer is not None:
        entries.append((producers.PRODUCER_ID, props.longstr(producer)))
    if sequence is not None:
        entries.append((producers.PRODUCER_SEQUENCE, props.long(sequence)))
    return (b"", b"s", props.with_headers(b"\x00\x00", entries), body)


def publish(stream: Stream, records) -> list[bool]:
    accepted = [stream.stage(record, True) for record in records]
    stream.flush(NOW_MS)
    asyncio.run(stream.commit())
    return accepted


def bodies(stream: Stream) -> list[bytes]:
    return [record.body for record in stream.log.read(0, 10_000, 1 << 30)]


def test_producer_of_reads_both_headers_or_nothing():
    assert producer_of(message("p", 7)[2]) == ("p", 7)
    assert producer_of(message("p", None)[2]) is None
    assert producer_of(message(None, 7)[2]) is None
    assert producer_of(b"\x00\x00") is None


def test_duplicates_are_dropped_and_confirmed_even_within_a_tick(tmp_path):
    stream = open_stream(tmp_path)
    first = [message("p", n, f"p{n}".encode()) for n in (1, 2, 3)]
    assert publish(stream, first) == [True, True, True]
    retry = [message("p", n, f"p{n}".encode()) for n in (2, 3, 4, 4)]
    retry.append(message("q", 1, b"q1"))
    retry.append(message(None, None, b"plain"))
    stream.take_written()
    # A refused publish would be nacked: duplicates are accepted, just not appended. They
    # wait for the commit all the same: their original's publish may have failed to reach
    # the quorum (nacked), and be taken back by a failover.
    accepted = [stream.stage(record, True, publisher=tag) for tag, record in enumerate(retry)]
    stream.flush(NOW_MS)
    assert accepted == [True] * 6
    written, _, commit_wanted = stream.take_written()
    assert sorted(written) == [0, 1, 2, 3, 4, 5] and commit_wanted
    assert bodies(stream) == [b"p1", b"p2", b"p3", b"p4", b"q1", b"plain"]
    assert stream.producers.duplicates == 3


def test_a_duplicate_alone_waits_for_the_commit_of_its_original(tmp_path):
    stream = open_stream(tmp_path)
    stream.stage(message("p", 1), True, publisher="original")
    stream.flush(NOW_MS)
    stream.take_written()
    stream.stage(message("p", 1), True, publisher="retry")
    stream.flush(NOW_MS)
    assert stream.take_written() == (["retry"], [], True)


def test_the_sequences_come_back_from_the_log_and_the_snapshot(tmp_path, monkeypatch):
    monkeypatch.setattr(producers, "SNAPSHOT_EVERY_RECORDS", 4)
    stream = open_stream(tmp_path)
    publish(stream, [message("p", n) for n in range(1, 6)])
    assert (tmp_path / "s" / producers.SNAPSHOT_FILE).exists()
    # Written after the snapshot: found by the scan of the log after a crash (no shutdown).
    publish(stream, [message("p", 6), message("r", 10)])
    stream.log.close()
    reopened = open_stream(tmp_path)
    assert dict(reopened.producers.items()) == {"p": 6, "r": 10}
    publish(reopened, [message("p", 6), message("r", 9), message("r", 11)])
    assert len(bodies(reopened)) == 8


def test_a_failed_write_takes_the_sequences_back(tmp_path, monkeypatch):
    stream = open_stream(tmp_path)
    publish(stream, [message("p", 1)])

    def fail(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(PartitionLog, "append", fail)
    stream.stage(message("p", 2), True, publisher="x")
    stream.flush(NOW_MS)
    assert stream.take_written()[1] == ["x"]
    monkeypatch.undo()
    assert stream.producers.get("p") == 1
    assert publish(stream, [message("p", 2)]) == [True]
    assert len(bodies(stream)) == 2


def test_the_producers_kept_are_bounded(tmp_path, monkeypatch):
    monkeypatch.setattr(producers, "PRODUCERS_MAX", 3)
    stream = open_stream(tmp_path)
    publish(stream, [message(f"p{n}", 1) for n in range(5)])
    assert [name for name, _ in stream.producers.items()] == ["p2", "p3", "p4"]


@pytest.mark.parametrize("sequence", [0, -5])
def test_any_integer_sequence_starts_a_producer(tmp_path, sequence):
    sequences = ProducerSequences(tmp_path, open_stream(tmp_path).log)
    assert sequences.accept(0, "p", sequence)
    assert not sequences.accept(1, "p", sequence)


class QuorumBehind(PartitionLog):
    """A replicated log whose quorum has not caught up with its fsynced end."""

    __slots__ = ("committed",)

    @property
    def committed_offset(self) -> int:
        return self.committed


def test_a_snapshot_holds_only_what_the_quorum_committed(tmp_path, monkeypatch):
    """A failover may take back what only this replica fsynced: a snapshot naming its
    sequences would drop a retry of a message no log holds any more."""
    monkeypatch.setattr(producers, "SNAPSHOT_EVERY_RECORDS", 4)

    def open_behind(directory, config):
        log = QuorumBehind.open(directory, config)
        log.committed = 0
        return log

    engine = StreamLog.open(tmp_path / "s", LogConfig(), {}, open_log=open_behind)
    stream = Stream("/", "s", engine, arguments={}, effective_arguments={}, batch_records_max=64)
    publish(stream, [message("p", n) for n in range(1, 6)])
    assert not (tmp_path / "s" / producers.SNAPSHOT_FILE).exists()
    stream.log.committed = stream.log.end_offset
    asyncio.run(stream.commit())
    assert (tmp_path / "s" / producers.SNAPSHOT_FILE).exists()
