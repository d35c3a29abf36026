from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from ampscope.spool import (
    FILE_MAGIC,
    Damage,
    Frame,
    Spool,
    acknowledged_offset,
    default_spool_dir,
    scan,
    spool_files,
)


def body(i: int) -> bytes:
    return json.dumps({"records": [{"seq": i}]}).encode()


def write(directory: Path, n: int, **kw: int) -> Spool:
    spool = Spool(directory, 1 << 20, fsync=False, **kw)
    for i in range(n):
        assert spool.append(body(i), 1)
    return spool


def frames(path: Path) -> list[Frame | Damage]:
    return list(scan(path))


class TestFormat:
    def test_frames_read_back_in_order(self, tmp_path: Path) -> None:
        spool = write(tmp_path, 3)
        spool.close()
        [path] = spool_files(tmp_path)
        assert path.read_bytes().startswith(FILE_MAGIC)
        assert [f.body for f in frames(path) if isinstance(f, Frame)] == [body(i) for i in range(3)]

    def test_truncated_tail_is_reported_and_the_complete_frames_survive(
        self, tmp_path: Path
    ) -> None:
        write(tmp_path, 3).close()
        [path] = spool_files(tmp_path)
        os.truncate(path, path.stat().st_size - 5)
        *good, damage = frames(path)
        assert [f.body for f in good if isinstance(f, Frame)] == [body(0), body(1)]
        assert isinstance(damage, Damage) and damage.end == path.stat().st_size
        assert damage.reason.startswith("truncated frame")

    def test_a_corrupt_frame_in_the_middle_hides_nothing_after_it(self, tmp_path: Path) -> None:
        write(tmp_path, 3).close()
        [path] = spool_files(tmp_path)
        data = bytearray(path.read_bytes())
        second = [f for f in frames(path) if isinstance(f, Frame)][1]
        data[second.end - 2] ^= 0xFF
        path.write_bytes(bytes(data))
        items = frames(path)
        assert [type(i).__name__ for i in items] == ["Frame", "Damage", "Frame"]
        assert isinstance(items[1], Damage) and items[1].reason == "checksum mismatch"
        assert isinstance(items[2], Frame) and items[2].body == body(2)

    def test_a_file_that_is_not_a_spool_is_one_damage(self, tmp_path: Path) -> None:
        path = tmp_path / "x.ampspool"
        path.write_bytes(b"hello")
        assert frames(path) == [Damage(path, 0, 5, "not an ampscope spool file (bad header)")]

    def test_default_dir_is_per_user_and_overridable(self, monkeypatch: pytest.MonkeyPatch) -> None:
        monkeypatch.setenv("AMPSCOPE_SPOOL_DIR", "/x/y")
        assert default_spool_dir() == Path("/x/y")
        monkeypatch.delenv("AMPSCOPE_SPOOL_DIR")
        monkeypatch.setenv("XDG_CACHE_HOME", "/c")
        assert default_spool_dir() == Path("/c/ampscope/spool")


class TestSpool:
    def test_nothing_is_created_before_the_first_append(self, tmp_path: Path) -> None:
        Spool(tmp_path / "s", 1000).close()
        assert not (tmp_path / "s").exists()

    def test_ack_persists_a_cursor_and_deletes_finished_segments(self, tmp_path: Path) -> None:
        spool = write(tmp_path, 4, segment_bytes=100)  # rolls over after every frame or two
        segments = spool_files(tmp_path)
        assert len(segments) >= 2 and spool.frames == 4
        head = spool.head()
        assert head == (body(0), 1)
        spool.ack()
        first = spool_files(tmp_path)[0]
        if first == segments[0]:  # the first segment still holds frame 1: the cursor says where
            assert acknowledged_offset(first) > len(FILE_MAGIC)
        for _ in range(3):
            spool.ack()
        assert spool.head() is None and list(tmp_path.iterdir()) == []
        assert spool.append(body(9), 1) and len(spool_files(tmp_path)) == 1

    def test_append_is_refused_at_the_cap(self, tmp_path: Path) -> None:
        frame = len(body(0)) + 12
        spool = Spool(tmp_path, len(FILE_MAGIC) + 2 * frame, fsync=False)
        assert spool.append(body(0), 1) and spool.append(body(1), 1)
        assert not spool.append(body(2), 1)
        assert spool.bytes_on_disk == len(FILE_MAGIC) + 2 * frame

    def test_a_damaged_frame_on_disk_reads_back_as_none(self, tmp_path: Path) -> None:
        spool = write(tmp_path, 1)
        [path] = spool_files(tmp_path)
        data = bytearray(path.read_bytes())
        data[-1] ^= 0xFF
        path.write_bytes(bytes(data))
        assert spool.head() == (None, 1)
