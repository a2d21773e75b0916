"""`warren bench redrive` against a real `warren serve`: the fill dead-letters every message,
the redrive moves each one to the target queue, and the report says so."""

from __future__ import annotations

import json

from warrenmq.server.cli import main


def test_a_redrive_bench_moves_every_dead_letter(warren_process, capsys):
    warren_process.start()
    status = main(
        [
            "bench",
            "redrive",
            "--url",
            warren_process.url,
            "--api",
            warren_process.management_url,
            "--messages",
            "2000",
            "--timeout",
            "120",
        ]
    )
    report = json.loads(capsys.readouterr().out)
    assert status == 0, report
    assert report["published"] == report["moved"] == report["target_ready"] == 2000
    assert (report["state"], report["kept"], report["dead_letters_left"]) == ("done", 0, 0)
    assert report["redrive_msgs_per_s"] > 0
