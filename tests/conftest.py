from __future__ import annotations

import os

# One intra-op thread per test process (and the processes it starts: ranks, examples), unless
# the caller says otherwise: before any torch import, which reads it. pytest-xdist runs several
# processes on this 2-core machine, and torch's default of one OpenMP thread per core made them
# spin-wait against each other: tests/scenarios/test_scenarios.py took 84 CPU-s with 2 threads
# against 21 with 1 (112 against 50 s wall, same 99 tests, 2026-12-06).
os.environ.setdefault("OMP_NUM_THREADS", "1")

import itertools
import re
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.support.databases import TEMPLATES, Dialect, empty_database, migrated_database
from tests.support.servers import ServerProcess

HEAVY = ("browser", "multiprocess", "compile", "frameworks", "slow")
"""The tiers `make test-fast` leaves out: their files are the long ones."""


_FILE_MARKS = re.compile(r"^pytestmark = (.*)$", re.MULTILINE)
_EXPRESSION_WORDS = re.compile(r"[A-Za-z_]\w*")


def _has(present: set[str]) -> Callable[..., bool]:
    """`-m`'s matcher for a test carrying exactly `present`."""
    def matches(name: str, /, **_: str | int | bool | None) -> bool:
        return name in present
    return matches


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    """A test file whose module-level `pytestmark` puts every test in a tier that `-m` leaves
    out is not imported at all: `make test-fast` would deselect each of its tests anyway, and
    importing them cost every xdist process seconds (Lightning's import alone ~2.5 s).

    Read from the source, not the module; ignored only when `-m` is false whatever other marker
    a test of the file may carry besides the file's (so `-m "browser and postgres"` still
    collects a browser file)."""
    expression = config.option.markexpr
    if not expression or not collection_path.name.startswith("test_") \
            or collection_path.suffix != ".py":
        return None
    found = _FILE_MARKS.search(collection_path.read_text(encoding="utf-8"))
    marks = set(re.findall(r"pytest\.mark\.(\w+)", found.group(1))) if found else set()
    if not marks & set(HEAVY):
        return None
    from _pytest.mark.expression import Expression  # pytest's own `-m` grammar

    compiled = Expression.compile(expression)
    others = sorted(set(_EXPRESSION_WORDS.findall(expression)) - {"and", "or", "not"} - marks)
    for extra in itertools.chain.from_iterable(
            itertools.combinations(others, n) for n in range(len(others) + 1)):
        if compiled.evaluate(_has(marks | set(extra))):
            return None
    return True


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """A test run on Postgres (any fixture parametrized "postgres") carries the `postgres`
    marker, so `-m "not postgres"` names the SQLite half of the suite.

    Files with a test of a heavy tier go first, each file's tests kept together and in order:
    pytest-xdist (`--dist loadfile`) hands out whole files in this order, so the long ones start
    early and the short ones fill the workers' ends, rather than one worker finishing a long
    file alone."""
    heavy_files: set[str] = set()
    for item in items:
        callspec = getattr(item, "callspec", None)
        if callspec is not None and "postgres" in callspec.params.values():
            item.add_marker(pytest.mark.postgres)
        if any(item.get_closest_marker(name) for name in HEAVY):
            heavy_files.add(item.nodeid.split("::")[0])
    items.sort(key=lambda item: item.nodeid.split("::")[0] not in heavy_files)  # stable


@pytest.fixture(autouse=True, scope="session")
def _spool_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Hooks built without `spool_dir` spool here, never into the user's ~/.cache."""
    mp = pytest.MonkeyPatch()
    mp.setenv("AMPSCOPE_SPOOL_DIR", str(tmp_path_factory.mktemp("spool")))
    yield
    mp.undo()


@pytest.fixture(autouse=True, scope="session")
def _database_templates() -> Iterator[None]:
    """This test process's migrated templates (made on first use) go when the session ends."""
    yield
    TEMPLATES.drop()


@pytest.fixture(params=["sqlite", "postgres"])
def dialect(request: pytest.FixtureRequest) -> Dialect:
    name: Dialect = request.param
    return name


@pytest.fixture
def db_url(dialect: Dialect, tmp_path: Path) -> Iterator[str]:
    """An empty database of each dialect: for what creates the schema (migrations, the CLI)."""
    with empty_database(dialect, tmp_path) as url:
        yield url


@pytest.fixture
def migrated_url(dialect: Dialect, tmp_path: Path) -> Iterator[str]:
    """A database of each dialect at the Alembic head, a copy of the session's template."""
    with migrated_database(dialect, tmp_path) as url:
        yield url


@pytest.fixture
def postgres_url(tmp_path: Path) -> Iterator[str]:
    with empty_database("postgres", tmp_path) as url:
        yield url


@pytest.fixture
def server(migrated_url: str, tmp_path: Path) -> Iterator[ServerProcess]:
    """A real uvicorn server over `migrated_url`, on a free 127.0.0.1 port."""
    proc = ServerProcess(migrated_url, tmp_path).start()
    try:
        yield proc
    finally:
        proc.stop()


@pytest.fixture(scope="module", params=["sqlite", "postgres"])
def module_server(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServerProcess]:
    """A real server over a fresh database of each dialect, shared by one test module."""
    log_dir = tmp_path_factory.mktemp("server")
    with migrated_database(request.param, log_dir) as url:
        proc = ServerProcess(url, log_dir).start()
        try:
            yield proc
        finally:
            proc.stop()
