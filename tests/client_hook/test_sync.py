from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from ampscope.spool import Spool, spool_files
from ampscope.sync import sync
from ampscope.transport import MemorySender, Outcome, SendResult
from ampscope_server.cli.main import main as cli_main
from tests.client_hook.httpstub import Reply, StubServer


def body(i: int) -> bytes:
    return json.dumps({"records": [{"seq": i}]}).encode()


def write(directory: Path, n: int) -> Spool:
    spool = Spool(directory, 1 << 20, fsync=False)
    for i in range(n):
        assert spool.append(body(i), 1)
    return spool


def seqs(sender: MemorySender) -> list[int]:
    return [p["records"][0]["seq"] for p in sender.payloads()]


def test_sends_every_unacknowledged_frame_and_reports_damage(tmp_path: Path) -> None:
    spool = write(tmp_path, 4)
    spool.ack()  # frame 0 was acknowledged by the transport before the process died
    spool.close()
    [path] = spool_files(tmp_path)
    with open(path, "ab") as f:
        f.write(b"\xa5SF1\x00\x00")  # a kill in the middle of a header
    sender = MemorySender()
    report = sync(tmp_path, sender=sender)
    assert [p["records"][0]["seq"] for p in sender.payloads()] == [1, 2, 3]
    assert (report.files, report.frames_sent, report.frames_skipped) == (1, 3, 1)
    assert len(report.damaged) == 1 and report.ok and sender.closed


def test_rejections_are_reported_and_the_rest_still_sent(tmp_path: Path) -> None:
    write(tmp_path, 3).close()
    sender = MemorySender([SendResult(Outcome.ACKED, 200),
                           SendResult(Outcome.REJECTED, 422, detail="bad")])
    report = sync(tmp_path, sender=sender)
    assert report.frames_sent == 2 and len(report.rejected) == 1 and not report.ok
    assert "HTTP 422 bad" in report.rejected[0]


def test_a_server_that_stays_away_stops_sync_in_order(tmp_path: Path) -> None:
    write(tmp_path, 2).close()
    sender = MemorySender([SendResult(Outcome.RETRY, 503)] * 10)
    report = sync(tmp_path, sender=sender, attempts=2)
    assert report.frames_sent == 0 and len(report.undelivered) == 2 and not report.ok
    first = report.undelivered[0]
    assert first.endswith("(503: )")
    assert report.summary().splitlines()[1:] == [  # one line for all, its reason the first's
        f"undelivered from {first} and the 1 frames after it; they stay spooled: run sync "
        "again once the server takes them"]


def test_cli_prints_accepted_and_duplicate_totals(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    write(tmp_path, 2).close()
    answer = b'{"run_id": "r", "attempt": 1, "accepted": 1, "duplicates": 0}'
    with StubServer([Reply(200, body=answer), Reply(200, body=answer)]) as server:
        assert cli_main(["sync", str(tmp_path), "--server", server.url]) == 0
    out = capsys.readouterr().out
    assert "2 frames sent (0 already acknowledged), 2 records accepted, 0 duplicates" in out


def test_cli_refuses_a_missing_path(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli_main(["sync", str(tmp_path / "nope"), "--server", "http://127.0.0.1:1"]) == 2
    assert "no spool file or directory" in capsys.readouterr().err


def test_totals_come_from_the_servers_answers(tmp_path: Path) -> None:
    write(tmp_path, 3).close()
    answers = [b'{"accepted": 2, "duplicates": 0}', b'{"accepted": 0, "duplicates": 1}',
               b"not json"]
    sender = MemorySender([SendResult(Outcome.ACKED, 200, body=a) for a in answers])
    report = sync(tmp_path, sender=sender)
    assert (report.frames_sent, report.accepted, report.duplicates) == (3, 2, 1)
    assert report.ok


def test_a_retried_frame_is_sent_again_and_order_is_kept(tmp_path: Path) -> None:
    write(tmp_path, 2).close()
    sender = MemorySender([SendResult(Outcome.RETRY, 503, retry_after=0.0)])
    report = sync(tmp_path, sender=sender, attempts=2)
    assert seqs(sender) == [0, 0, 1]
    assert report.frames_sent == 2 and report.ok


def test_a_refused_client_stops_at_once(tmp_path: Path) -> None:
    write(tmp_path, 3).close()
    sender = MemorySender([SendResult(Outcome.DENIED, 401, detail="bad token")])
    report = sync(tmp_path, sender=sender, attempts=5)
    assert seqs(sender) == [0]  # no retry, and nothing after it is tried
    assert report.frames_sent == 0 and not report.ok
    assert len(report.undelivered) == 3
    assert report.undelivered[0].endswith("(refused, HTTP 401: bad token)")


def test_files_are_sent_oldest_first_and_an_acknowledged_spool_is_skipped(
    tmp_path: Path,
) -> None:
    first = write(tmp_path, 2)
    first.close()
    time.sleep(0.002)  # file names begin with the millisecond they were created in
    second = Spool(tmp_path, 1 << 20, fsync=False)
    assert second.append(body(7), 1)
    second.close()
    assert len(spool_files(tmp_path)) == 2
    sender = MemorySender()
    report = sync(tmp_path, sender=sender)
    assert seqs(sender) == [0, 1, 7] and report.files == 2
    again = sync(tmp_path, sender=MemorySender())  # sync never writes the .ack cursor
    assert again.frames_sent == 3 and again.frames_skipped == 0


def test_needs_a_server_or_a_sender(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="needs a server URL or a sender"):
        sync(tmp_path)
