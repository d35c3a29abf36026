"""``ampscope sync PATH``: upload spool files to a server, in order. Torch-free.

Every complete frame past a file's ``.ack`` cursor is POSTed as it is, oldest file first; ingest
is idempotent, so a second sync only counts duplicates. An older server gets frames one version
lower (``ampscope.negotiate``). Damaged stretches are reported and skipped, the frames around
them still sent. Sync never modifies the spool: delete it once the summary says all arrived.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field

from ampscope.negotiate import Negotiation
from ampscope.senders import HttpSender, Outcome, Sender
from ampscope.spool import Damage, acknowledged_offset, scan, spool_files

__all__ = ["SyncReport", "sync"]


@dataclass
class SyncReport:
    files: int = 0
    frames_sent: int = 0
    frames_skipped: int = 0  # acknowledged before, per the .ack cursor
    accepted: int = 0
    duplicates: int = 0
    rejected: list[str] = field(default_factory=list)  # "file@offset: HTTP 4xx detail"
    damaged: list[Damage] = field(default_factory=list)
    undelivered: list[str] = field(default_factory=list)  # the server stayed away

    @property
    def ok(self) -> bool:
        """Every readable frame reached the server and was taken (accepted or a duplicate)."""
        return not self.rejected and not self.undelivered

    def summary(self) -> str:
        lines = [
            f"{self.files} files, {self.frames_sent} frames sent ({self.frames_skipped} already "
            f"acknowledged), {self.accepted} records accepted, {self.duplicates} duplicates, "
            f"{len(self.rejected)} frames rejected, {len(self.damaged)} damaged stretches, "
            f"{len(self.undelivered)} frames undelivered"
        ]
        lines += [f"damaged: {d.path}@{d.offset}-{d.end}: {d.reason}" for d in self.damaged]
        lines += [f"rejected: {r}" for r in self.rejected]
        if self.undelivered:  # the first holds the reason; the rest only wait behind it
            more = len(self.undelivered) - 1
            lines.append(f"undelivered from {self.undelivered[0]}"
                         + (f" and the {more} frames after it" if more else "")
                         + "; they stay spooled: run sync again once the server takes them")
        return "\n".join(lines)


def sync(
    path: str | os.PathLike[str],
    server: str | None = None,
    *,
    sender: Sender | None = None,
    timeout: float = 30.0,
    attempts: int = 5,
    token: str | None = None,
) -> SyncReport:
    """Upload the spool at ``path`` (a directory or one ``.ampspool`` file) to ``server``. A 4xx
    refusal of a frame is reported and skipped; a frame that keeps failing (connection, 5xx, 408,
    429: ``attempts`` tries with backoff) stops sync there, so a later run resumes in order; a
    refusal of the client (401, 403, 410: the bearer ``token``) stops it too."""
    if sender is None:
        if server is None:
            raise ValueError("sync needs a server URL or a sender")
        sender = HttpSender(server, token=token)
    report = SyncReport()
    negotiation = Negotiation()
    files = spool_files(path)
    try:
        for file in files:
            if not file.exists():
                raise FileNotFoundError(f"no spool file or directory at {file}")
            report.files += 1
            acked = acknowledged_offset(file)
            for item in scan(file):
                if isinstance(item, Damage):
                    report.damaged.append(item)
                    continue
                if item.end <= acked:
                    report.frames_skipped += 1
                    continue
                if report.undelivered:
                    report.undelivered.append(f"{file}@{item.offset}")
                    continue
                _send(sender, item.body, f"{file}@{item.offset}", report, timeout, attempts,
                      negotiation)
    finally:
        sender.close()
    return report


def _send(sender: Sender, body: bytes, where: str, report: SyncReport, timeout: float,
          attempts: int, negotiation: Negotiation) -> None:
    body = negotiation.prepare(body)
    attempt = 0
    while attempt < attempts:
        result = sender.send(body, timeout)
        if result.outcome is Outcome.ACKED:
            negotiation.accepted()
            report.frames_sent += 1
            try:
                answer = json.loads(result.body or result.detail)
                report.accepted += int(answer.get("accepted", 0))
                report.duplicates += int(answer.get("duplicates", 0))
            except (ValueError, TypeError, AttributeError):
                pass
            return
        if result.outcome is Outcome.REJECTED:
            lower = negotiation.refused(body, result)
            if lower is not None:  # an older server: the same frame one version lower
                body = lower
                continue
            report.rejected.append(f"{where}: HTTP {result.status} {result.detail}")
            return
        if result.outcome is Outcome.DENIED:
            report.undelivered.append(f"{where} (refused, HTTP {result.status}: {result.detail})")
            return
        if attempt + 1 < attempts:
            time.sleep(min(60.0, result.retry_after) if result.retry_after is not None
                       else min(5.0, 0.2 * 2**attempt))
        attempt += 1
    report.undelivered.append(f"{where} ({result.status or 'no answer'}: {result.detail})")

