"""SIGKILL a real process using a queue at random moments; the reopened queue keeps its promises.

The model test (test_queue_model.py) simulates crashes by cutting the logs; this one kills a
process mid-flight, with commits and their fsync threads running, many times over the same
queue. The worker logs what it did, line by line, before and after each commit:

    T offset      delivered (taken)
    A offset      acknowledged (or dropped from the head)
    B end         a commit begins; `end` is the end offset at that moment
    C             that commit returned

After each kill the test opens the queue and checks: every message below the end of the last
returned commit is there and intact; no ack that preceded a returned commit is undone; every
message not acked is ready; every delivered message that is ready is flagged redelivered.
"""

import os
import random
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from warrenmq.log import LogConfig
from warrenmq.server.queue import LogQueue, QueueConfig

WORKER = textwrap.dedent(
    """
    import asyncio, random, sys
    from warrenmq.log import LogConfig
    from warrenmq.server.queue import LogQueue, QueueConfig

    def say(line):
        sys.stdout.write(line + "\\n")
        sys.stdout.flush()

    async def main(directory, seed, config):
        rng = random.Random(seed)
        queue = LogQueue.open(directory, config)
        say("O")
        in_flight = []
        while True:
            end = queue.end_offset
            queue.append([(b"", b"k", b"", b"%d" % (end + i)) for i in range(rng.randint(1, 40))])
            for message in queue.take_many(rng.randint(0, 40)):
                say(f"T {message.offset}")
                in_flight.append(message.offset)
            rng.shuffle(in_flight)
            for _ in range(rng.randint(0, len(in_flight))):
                offset = in_flight.pop()
                if rng.random() < 0.2:
                    queue.requeue([offset])
                else:
                    queue.ack(offset)
                    say(f"A {offset}")
            if rng.random() < 0.1:
                for _ in range(rng.randint(1, 5)):
                    head = queue.peek()
                    if head is None:
                        break
                    assert queue.drop_head(1) == 1
                    say(f"A {head.offset}")
            say(f"B {queue.end_offset}")
            await queue.commit()
            say("C")

    asyncio.run(main(sys.argv[1], int(sys.argv[2]), eval(sys.argv[3])))
    """
)

CONFIG = QueueConfig(
    message_log=LogConfig(segment_bytes_max=8192, tail_cache_bytes_max=4096),
    ack_log=LogConfig(segment_bytes_max=1024, tail_cache_bytes_max=0),
    delivered_mark_lead=64,
    ack_log_compact_bytes=2048,
)


def run_and_kill(directory, seed, rng):
    worker = subprocess.Popen(
        [sys.executable, "-c", WORKER, str(directory), str(seed), repr(CONFIG)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        # Unbuffered: communicate() reads the descriptor, so readline must not read ahead.
        bufsize=0,
    )
    try:
        # Wait until it has opened the queue, then let it run for a random while.
        assert worker.stdout.readline() == b"O\n", worker.stderr.read()
        time.sleep(rng.uniform(0.0, 0.3))
        os.kill(worker.pid, signal.SIGKILL)
        output, _ = worker.communicate(timeout=30)
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.wait()
    lines = output.decode().split("\n")
    # The last line may have been cut by the kill.
    return [line.split() for line in lines[:-1]]


@pytest.mark.slow
def test_sigkill_at_random_moments_never_breaks_the_guarantees(tmp_path):
    rng = random.Random(20261121)
    directory = tmp_path / "queue"
    acked = set()  # acked and not (yet) found undone
    durably_acked = set()  # acked before a commit that returned: never to come back
    delivered = set()
    for round_ in range(25):
        lines = run_and_kill(directory, round_, rng)
        committed_end = 0
        acks_since_commit = set()
        committing = None
        for line in lines:
            kind = line[0]
            if kind == "T":
                delivered.add(int(line[1]))
            elif kind == "A":
                offset = int(line[1])
                acked.add(offset)
                acks_since_commit.add(offset)
            elif kind == "B":
                committing = (int(line[1]), acks_since_commit)
                acks_since_commit = set()
            elif kind == "C":
                end, covered = committing
                committed_end = max(committed_end, end)
                durably_acked |= covered
                committing = None
            else:
                raise AssertionError(line)
        queue = LogQueue.open(directory, CONFIG)
        try:
            end = queue.end_offset
            assert end >= committed_end
            redeliver = set(queue._redeliver)
            ready = redeliver | set(range(queue._next, end))
            assert queue.ready_count == len(ready)
            assert not ready & durably_acked, sorted(ready & durably_acked)[:10]
            missing = set(range(end)) - ready - acked
            assert not missing, sorted(missing)[:10]
            assert (ready & delivered) <= redeliver
            offset = queue._log.start_offset
            while offset < end:
                records = queue._log.read(offset, 500)
                for record in records:
                    assert record.body == b"%d" % record.offset
                offset = records[-1].offset + 1
        finally:
            queue.close()
        # What survived is the truth the next round starts from.
        acked = set(range(end)) - ready
        durably_acked &= set(range(end))
        delivered &= set(range(end))
    assert end > 0 and durably_acked, "the rounds were too short to test anything"
