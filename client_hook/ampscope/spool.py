"""The disk spool: append-only, checksummed, size-bounded files of encoded ingest batches.

Batch bodies (exact ``POST /api/ingest`` bytes with the layer table: each frame stands alone)
are appended while the server is away and replayed in order later, or uploaded by ``ampscope
sync``; ingest is idempotent, so re-sending is harmless. Each ``Spool`` (one per attempt) writes
its own files::

    <dir>/<unix ms, 13 digits>-<pid>-<random hex>-<segment, 5 digits>.ampspool
    <dir>/<same name>.ack          the acknowledged byte offset in that segment (text)
    file: FILE_MAGIC (8 bytes), then frames of
    FRAME_MAGIC (4 bytes) | length (u32, big-endian) | crc32(length bytes + body) (u32, BE) | body

``scan`` reports a bad frame as ``Damage`` and resumes at the next valid one. A frame is one
``O_APPEND`` write, ``fdatasync``'d before it counts as spooled (so it survives a kill or power
loss); the ``.ack`` cursor is replaced atomically, not synced (at worst a duplicate).
``max_bytes`` caps the files; acknowledged segments are deleted.
"""

from __future__ import annotations

import contextlib
import logging
import os
import secrets
import struct
import threading
import time
import zlib
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "FILE_MAGIC",
    "FRAME_MAGIC",
    "SUFFIX",
    "Damage",
    "Frame",
    "Spool",
    "acknowledged_offset",
    "default_spool_dir",
    "encode_frame",
    "scan",
    "spool_files",
]

logger = logging.getLogger("ampscope")

FILE_MAGIC = b"AMPSPL1\n"
FRAME_MAGIC = b"\xa5SF1"
SUFFIX = ".ampspool"
ACK_SUFFIX = ".ack"
_HEAD = struct.Struct(">4sII")  # magic, length, crc
MAX_FRAME = 1 << 31


def default_spool_dir() -> Path:
    """``$AMPSCOPE_SPOOL_DIR``, else the user's cache directory's ``ampscope/spool``."""
    explicit = os.environ.get("AMPSCOPE_SPOOL_DIR")
    if explicit:
        return Path(explicit)
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(cache) / "ampscope" / "spool"


def encode_frame(body: bytes) -> bytes:
    length = len(body)
    if length >= MAX_FRAME:
        raise ValueError(f"a spool frame holds at most {MAX_FRAME - 1} bytes, not {length}")
    size = length.to_bytes(4, "big")
    return _HEAD.pack(FRAME_MAGIC, length, zlib.crc32(body, zlib.crc32(size))) + body


@dataclass(frozen=True)
class Frame:
    path: Path
    offset: int  # of the frame header
    end: int  # offset just past the body
    body: bytes


@dataclass(frozen=True)
class Damage:
    """Bytes ``[offset, end)`` of ``path`` hold no valid frame; ``reason`` says why."""

    path: Path
    offset: int
    end: int
    reason: str


def _check(data: bytes, pos: int) -> tuple[int, str]:
    """(end of the frame at ``pos``, "") if it is valid, else (0, why not)."""
    if data[pos : pos + 4] != FRAME_MAGIC:
        return 0, "no frame marker"
    if pos + _HEAD.size > len(data):
        return 0, f"truncated frame header ({len(data) - pos} of {_HEAD.size} bytes)"
    _, length, crc = _HEAD.unpack_from(data, pos)
    end = pos + _HEAD.size + length
    if end > len(data):
        return 0, f"truncated frame ({len(data) - pos} of {end - pos} bytes)"
    body = data[pos + _HEAD.size : end]
    if zlib.crc32(body, zlib.crc32(length.to_bytes(4, "big"))) != crc:
        return 0, "checksum mismatch"
    return end, ""


def scan(path: str | os.PathLike[str], start: int | None = None) -> Iterator[Frame | Damage]:
    """Every frame of one spool file from ``start``, and a ``Damage`` per bad stretch."""
    path = Path(path)
    data = path.read_bytes()
    if not data.startswith(FILE_MAGIC):
        yield Damage(path, 0, len(data), "not an ampscope spool file (bad header)")
        return
    pos = len(FILE_MAGIC) if start is None else max(start, len(FILE_MAGIC))
    while pos < len(data):
        end, why = _check(data, pos)
        if end:
            yield Frame(path, pos, end, data[pos + _HEAD.size : end])
            pos = end
            continue
        # Resynchronise on the next marker that starts a valid frame.
        bad, nxt = pos, data.find(FRAME_MAGIC, pos + 1)
        while nxt != -1 and not _check(data, nxt)[0]:
            nxt = data.find(FRAME_MAGIC, nxt + 1)
        stop = len(data) if nxt == -1 else nxt
        if nxt == -1:
            why = f"{why}; {stop - bad} bytes to the end of the file are unreadable"
        yield Damage(path, bad, stop, why)
        pos = stop


def acknowledged_offset(path: str | os.PathLike[str]) -> int:
    """The offset up to which a spool file's frames were acknowledged (0: none, or no marker)."""
    ack = Path(str(path) + ACK_SUFFIX)
    try:
        return max(0, int(ack.read_text().strip() or 0))
    except (OSError, ValueError):
        return 0


def spool_files(path: str | os.PathLike[str]) -> list[Path]:
    """The spool files at ``path`` (a file, or a directory's ``*.ampspool``) in write order."""
    path = Path(path)
    if path.is_dir():
        return sorted(p for p in path.iterdir() if p.name.endswith(SUFFIX) and p.is_file())
    return [path]


@dataclass
class _Entry:
    segment: int
    offset: int
    end: int
    records: int


def _fdatasync(fd: int) -> None:
    sync = getattr(os, "fdatasync", os.fsync)
    sync(fd)


class Spool:
    """One process's spool file set, thread-safe; nothing is on disk before ``append``."""

    def __init__(
        self,
        directory: str | os.PathLike[str],
        max_bytes: int,
        *,
        segment_bytes: int = 16 * 2**20,
        fsync: bool = True,
    ) -> None:
        self.directory = Path(directory)
        self.max_bytes = max_bytes
        self.segment_bytes = max(1, segment_bytes)
        self.fsync = fsync
        self._stem = f"{int(time.time() * 1000):013d}-{os.getpid()}-{secrets.token_hex(4)}"
        self._lock = threading.Lock()
        self._entries: deque[_Entry] = deque()  # unacknowledged frames, oldest first
        self._sizes: dict[int, int] = {}  # segment -> bytes on disk
        self._segment = -1
        self._fd: int | None = None
        self._failed = False

    def path(self, segment: int) -> Path:
        return self.directory / f"{self._stem}-{segment:05d}{SUFFIX}"

    @property
    def bytes_on_disk(self) -> int:
        return sum(self._sizes.values())

    @property
    def frames(self) -> int:
        """Frames written and not yet acknowledged."""
        return len(self._entries)

    def append(self, body: bytes, records: int) -> bool:
        """Write one frame durably; False (nothing written) at the size cap or on an OS error."""
        frame = encode_frame(body)
        with self._lock:
            if self._failed:
                return False
            rolling = self._fd is None or self._sizes[self._segment] >= self.segment_bytes
            extra = len(frame) + (len(FILE_MAGIC) if rolling else 0)
            if self.bytes_on_disk + extra > self.max_bytes:
                return False
            try:
                if rolling:
                    self._roll()
                assert self._fd is not None
                offset = self._sizes[self._segment]
                view = memoryview(frame)
                while view:
                    view = view[os.write(self._fd, view) :]
                if self.fsync:
                    _fdatasync(self._fd)
            except OSError as exc:
                self._failed = True
                logger.error("ampscope cannot write its spool in %s (%s); records that cannot "
                             "be delivered are now dropped and counted", self.directory, exc)
                return False
            self._sizes[self._segment] = offset + len(frame)
            self._entries.append(_Entry(self._segment, offset, offset + len(frame), records))
            return True

    def _roll(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
            self._delete_finished()
        self.directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        self._segment += 1
        path = self.path(self._segment)
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND, 0o600)
        self._sizes[self._segment] = 0
        os.write(self._fd, FILE_MAGIC)
        self._sizes[self._segment] = len(FILE_MAGIC)
        if self.fsync:
            _fdatasync(self._fd)
            with contextlib.suppress(OSError):  # not every filesystem lets a directory be synced
                dfd = os.open(self.directory, os.O_RDONLY)
                try:
                    os.fsync(dfd)
                finally:
                    os.close(dfd)

    def head(self) -> tuple[bytes | None, int] | None:
        """The oldest unacknowledged (body, records), body None when corrupt; None when empty."""
        with self._lock:
            if not self._entries:
                return None
            entry = self._entries[0]
            try:
                with open(self.path(entry.segment), "rb") as f:
                    f.seek(entry.offset)
                    data = f.read(entry.end - entry.offset)
            except OSError:
                return None, entry.records
            end, _ = _check(data, 0)
            if end != len(data):
                return None, entry.records
            return data[_HEAD.size :], entry.records

    def ack(self) -> None:
        """The head frame is done with (acknowledged, or rejected and counted)."""
        with self._lock:
            entry = self._entries.popleft()
            if self._entries and self._entries[0].segment == entry.segment:
                self._write_cursor(entry.segment, entry.end)
            self._delete_finished()

    def _write_cursor(self, segment: int, offset: int) -> None:
        ack = Path(str(self.path(segment)) + ACK_SUFFIX)
        tmp = ack.with_name(ack.name + ".tmp")
        try:
            tmp.write_text(f"{offset}\n")
            os.replace(tmp, ack)
        except OSError:
            pass  # only costs a harmless re-send

    def _delete_finished(self) -> None:
        """Delete every fully acknowledged segment (the open one too: a fresh one follows)."""
        live = {e.segment for e in self._entries}
        for segment in [s for s in self._sizes if s not in live]:
            if segment == self._segment and self._fd is not None:
                os.close(self._fd)
                self._fd = None
            path = self.path(segment)
            for p in (path, Path(str(path) + ACK_SUFFIX)):
                with contextlib.suppress(FileNotFoundError):
                    p.unlink()
            del self._sizes[segment]

    def close(self) -> None:
        """Close the open segment; the files stay for a later replay or ``ampscope sync``."""
        with self._lock:
            if self._fd is not None:
                os.close(self._fd)
                self._fd = None
