"""The data source's options, named as Spark's Kafka source names them, and what they resolve
to: each topic partition's range of offsets.

Offsets are per topic and partition, as JSON: `{"orders": {"0": 42, "1": 7}}`, -2 meaning
the earliest retained offset and -1 the latest (Kafka's convention). A topic is what the
topic API calls one: a super stream (its partitions, in order) or a stream (partition 0).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass

from .client import Client, Partition, nodes_of

EARLIEST = -2
LATEST = -1
_NAMED = {"earliest": EARLIEST, "latest": LATEST}

Offsets = dict[str, dict[str, int]]
"""topic -> partition (as a string, JSON's keys) -> offset."""


@dataclass(frozen=True)
class Range:
    """Offsets [start, end) of one partition of a topic."""

    topic: str
    partition: int
    stream: str
    start: int
    end: int


def _flag(options: Mapping[str, str], name: str, default: bool) -> bool:
    value = options.get(name)
    if value is None:
        return default
    if value.lower() not in ("true", "false"):
        raise ValueError(f"{name} must be true or false, got {value!r}")
    return value.lower() == "true"


def _whole(options: Mapping[str, str], name: str, low: int = 1) -> int | None:
    value = options.get(name)
    if value is None:
        return None
    number = int(value)
    if number < low:
        raise ValueError(f"{name} must be at least {low}, got {number}")
    return number


@dataclass(frozen=True)
class SourceOptions:
    client: Client
    topics: tuple[str, ...]
    starting: str | Offsets
    ending: str | Offsets
    starting_timestamp_ms: int | None
    ending_timestamp_ms: int | None
    max_offsets_per_trigger: int | None
    min_partitions: int | None
    fail_on_data_loss: bool
    include_headers: bool

    @classmethod
    def parse(cls, options: Mapping[str, str], *, streaming: bool) -> SourceOptions:
        if "url" not in options:
            raise ValueError(
                "option url is required: the broker's HTTP address, such as "
                "http://guest:guest@localhost:15672"
            )
        given = [name for name in ("streams", "superStream") if options.get(name)]
        if len(given) != 1:
            raise ValueError("give exactly one of the options streams or superStream")
        topics = tuple(name.strip() for name in options[given[0]].split(",") if name.strip())
        if not topics:
            raise ValueError(f"{given[0]} names no stream")
        client = Client(
            nodes_of(options["url"], options.get("user"), options.get("password")),
            options.get("vhost", "/"),
        )
        return cls(
            client=client,
            topics=topics,
            starting=_offsets_option(
                options, "startingOffsets", "latest" if streaming else "earliest"
            ),
            ending=_offsets_option(options, "endingOffsets", "latest"),
            starting_timestamp_ms=_whole(options, "startingTimestamp", 0),
            ending_timestamp_ms=_whole(options, "endingTimestamp", 0),
            max_offsets_per_trigger=_whole(options, "maxOffsetsPerTrigger"),
            min_partitions=_whole(options, "minPartitions"),
            fail_on_data_loss=_flag(options, "failOnDataLoss", True),
            include_headers=_flag(options, "includeHeaders", False),
        )

    def partitions(self, timestamp_ms: int | None = None) -> dict[str, list[Partition]]:
        return {topic: self.client.partitions(topic, timestamp_ms) for topic in self.topics}

    def resolve(self, spec: str | Offsets, timestamp_ms: int | None) -> Offsets:
        """Where `spec` (or, when given, the timestamp: it wins, as in Kafka's source) puts
        each partition now."""
        found: Offsets = {}
        for topic, partitions in self.partitions(timestamp_ms).items():
            chosen = found[topic] = {}
            for partition in partitions:
                if timestamp_ms is not None:
                    at = partition.offset_for_timestamp
                    offset = partition.next_offset if at is None else at
                else:
                    offset = _offset_in(spec, topic, partition)
                chosen[str(partition.index)] = offset
        return found


def _offset_in(spec: str | Offsets, topic: str, partition: Partition) -> int:
    if isinstance(spec, str):
        wanted = _NAMED[spec]
    else:
        wanted = spec.get(topic, {}).get(str(partition.index), EARLIEST)
    if wanted == EARLIEST:
        return partition.first_offset
    if wanted == LATEST:
        return partition.next_offset
    return wanted


def _offsets_option(options: Mapping[str, str], name: str, default: str) -> str | Offsets:
    value = options.get(name, default).strip()
    if value in _NAMED:
        return value
    try:
        parsed = json.loads(value)
    except ValueError:
        raise ValueError(
            f"{name} must be earliest, latest or JSON offsets, got {value!r}"
        ) from None
    if not isinstance(parsed, dict) or not all(
        isinstance(partitions, dict)
        and all(isinstance(offset, int) and offset >= EARLIEST for offset in partitions.values())
        for partitions in parsed.values()
    ):
        raise ValueError(f'{name} must look like {{"stream": {{"0": 42}}}}, got {value!r}')
    return {
        topic: {str(p): o for p, o in partitions.items()} for topic, partitions in parsed.items()
    }


def ranges(
    names: Mapping[str, list[Partition]], start: Offsets, end: Offsets, min_partitions: int | None
) -> list[Range]:
    """The non-empty [start, end) of each partition, split by offset so that there are about
    `min_partitions` of them when there are fewer (each split in proportion to its size, as
    Kafka's source splits)."""
    whole = []
    for topic, partitions in names.items():
        for partition in partitions:
            key = str(partition.index)
            low = start.get(topic, {}).get(key, partition.first_offset)
            high = end.get(topic, {}).get(key, low)
            if high > low:
                whole.append(Range(topic, partition.index, partition.stream, low, high))
    if not min_partitions or len(whole) >= min_partitions:
        return whole
    total = sum(piece.end - piece.start for piece in whole)
    split = []
    for piece in whole:
        size = piece.end - piece.start
        parts = min(size, max(1, math.ceil(size * min_partitions / total)))
        for i in range(parts):
            low = piece.start + size * i // parts
            high = piece.start + size * (i + 1) // parts
            split.append(Range(piece.topic, piece.partition, piece.stream, low, high))
    return split
