"""The tiers' collection filter (tests/conftest.py `pytest_ignore_collect`): a file is left
unimported only when `-m` deselects every test it can hold."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import pytest

from tests.conftest import pytest_ignore_collect

FAST = "not (browser or multiprocess or compile or frameworks or slow)"


def ignored(tmp_path: Path, source: str, expression: str, name: str = "test_x.py") -> bool | None:
    path = tmp_path / name
    path.write_text(source, encoding="utf-8")
    config = cast(Any, SimpleNamespace(option=SimpleNamespace(markexpr=expression)))
    return pytest_ignore_collect(path, config)


@pytest.mark.parametrize(("source", "expression", "expected"), [
    ("pytestmark = pytest.mark.frameworks\n", FAST, True),
    ("pytestmark = [pytest.mark.compile, pytest.mark.filterwarnings(\n    'x')]\n", FAST, True),
    ("pytestmark = pytest.mark.slow\n", "", None),  # no -m: everything is collected
    ("pytestmark = pytest.mark.slow\n", "slow", None),
    ("pytestmark = pytest.mark.slow\n", "not postgres", None),
    # a browser file may hold tests that conftest marks `postgres` later
    ("pytestmark = pytest.mark.browser\n", "browser and postgres", None),
    ("pytestmark = pytest.mark.browser\n", "not browser and postgres", True),
    # only a heavy tier's file mark counts; test-level marks are not read
    ("pytestmark = pytest.mark.filterwarnings('x')\n", FAST, None),
    ("@pytest.mark.slow\ndef test_a() -> None: ...\n", FAST, None),
])
def test_a_file_is_ignored_only_when_every_test_would_be_deselected(
        tmp_path: Path, source: str, expression: str, expected: bool | None) -> None:
    assert ignored(tmp_path, "import pytest\n" + source, expression) is expected


def test_files_that_are_not_test_modules_are_collected(tmp_path: Path) -> None:
    assert ignored(tmp_path, "pytestmark = pytest.mark.slow\n", FAST, name="support.py") is None
    assert ignored(tmp_path, "pytestmark = pytest.mark.slow\n", FAST, name="test_x.txt") is None
