"""Service: the runs list's pages — sort, keyset cursor, filter — over `run_counters_repository`.

A page is `limit` runs in the order asked for, after an opaque cursor (the previous page's last
(sort value, id), base64url JSON): stable while runs are added, unlike an offset. The filter is
applied here, on the server, before the page is cut, so "the next page" means the next runs that
match, and it matches what the page's own filter box does in the browser (`web/js/runs.js`):
words (each must appear, case-insensitive, in the name, project, id, status or a tag) or one
regular expression (searched, case-insensitive). Unfiltered, a page reads `limit + 1` rows;
filtered, it reads the runs' short keys in order, FILTER_CHUNK at a time, until the page is
full (the runs table only: never a step, never a config), then the page's rows alone.
"""

from __future__ import annotations

import base64
import binascii
import json
import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from sqlalchemy.orm import Session

from ampscope_server.errors import InvalidPayload
from ampscope_server.runs.schemas import RunStatus
from ampscope_server.store import run_counters_repository
from ampscope_server.store.models import Run, RunCounters
from ampscope_server.store.run_counters_repository import SORT_KEYS, ListedKey, SortKey

DEFAULT_LIMIT = 100
MAX_LIMIT = 500
FILTER_MAX = 200
"""The longest filter accepted (a regular expression is run on the server)."""
FILTER_CHUNK = 500


@dataclass(frozen=True)
class RunsQuery:
    sort: SortKey = "started"
    descending: bool = True
    cursor: str | None = None
    limit: int = DEFAULT_LIMIT
    q: str = ""
    regex: bool = False


@dataclass(frozen=True)
class RunsPage:
    runs: list[Run]
    counters: dict[str, RunCounters]
    """The runs' counters rows (a run without steps has none), read with them."""
    next_cursor: str | None
    """Where the next page starts; None: this is the last."""
    total: int | None
    """How many runs there are (the viewer's); None when filtered (counting the matches would
    read every run)."""


def encode_cursor(sort: SortKey, descending: bool, value: Any, run_id: str) -> str:
    text = json.dumps([sort, "desc" if descending else "asc", value, run_id],
                      separators=(",", ":"))
    return base64.urlsafe_b64encode(text.encode()).decode().rstrip("=")


def decode_cursor(cursor: str, sort: SortKey, descending: bool) -> tuple[Any, str]:
    """(sort value, run id) of a cursor made for this sort and direction; 422 otherwise."""
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        made_sort, direction, value, run_id = json.loads(raw)
    except (ValueError, TypeError, binascii.Error, UnicodeDecodeError):
        raise InvalidPayload("cursor: not a cursor this server gave (pass the `next` link of "
                             "the previous page unchanged)") from None
    wanted = "desc" if descending else "asc"
    if (made_sort, direction) != (sort, wanted):
        raise InvalidPayload(f"cursor: made for sort={made_sort} order={direction}, but this "
                             f"request asks sort={sort} order={wanted}")
    numeric = isinstance(value, (int, float)) and not isinstance(value, bool)
    # Postgres refuses a NUL in a query parameter; no stored name or id holds one.
    if not isinstance(run_id, str) or "\x00" in run_id or not (
            (isinstance(value, str) and "\x00" not in value)
            or (numeric and math.isfinite(value))):
        raise InvalidPayload("cursor: not a cursor this server gave")
    return value, run_id


class Listed(Protocol):
    """What the filter reads of a run: a stored `Run` or the key walk's `ListedKey`."""

    @property
    def id(self) -> str: ...
    @property
    def name(self) -> str: ...
    @property
    def project(self) -> str: ...
    @property
    def status(self) -> str: ...
    @property
    def updated_at(self) -> float: ...
    @property
    def tags(self) -> list[Any]: ...


def crash_cutoff(now: float, crash_timeout_s: float) -> float:
    """The crash rule's one bound: an active run last updated before it has crashed (nothing
    ingested for `crash_timeout_s`). `derive_status` applies it to a run, the status sort
    (`run_counters_repository`) to the column, with the same comparison."""
    return now - crash_timeout_s


def derive_status(stored: str, updated_at: float, crashed_before: float) -> RunStatus:
    """A run's status as every read shows it: `crashed` for an active run last updated before
    `crashed_before`, else the stored one."""
    if stored == RunStatus.ACTIVE.value and updated_at < crashed_before:
        return RunStatus.CRASHED
    return RunStatus(stored)


def matcher(q: str, regex: bool, crashed_before: float) -> Callable[[Listed], bool] | None:
    """The filter as a predicate over runs (None: no filter); 422 for an invalid one."""
    query = q.strip()
    if not query:
        return None
    if len(query) > FILTER_MAX:
        raise InvalidPayload(f"q: at most {FILTER_MAX} characters")

    def fields(run: Listed) -> list[str]:
        status = derive_status(run.status, run.updated_at, crashed_before).value
        return [run.name, run.project, run.id, status,
                *(str(tag) for tag in run.tags)]

    if regex:
        try:
            pattern = re.compile(query, re.IGNORECASE)
        except re.error as exc:
            raise InvalidPayload(f"q: invalid regular expression: {exc}") from None
        return lambda run: any(pattern.search(field) for field in fields(run))
    words = query.lower().split()
    return lambda run: all(word in " ".join(fields(run)).lower() for word in words)


def runs_page(session: Session, query: RunsQuery, project: str | None, crashed_before: float
         ) -> RunsPage:
    """The runs of one page of the list (of `project`, when given)."""
    if query.sort not in SORT_KEYS:
        raise InvalidPayload(f"sort: one of {', '.join(SORT_KEYS)}")
    after = (None if query.cursor is None
             else decode_cursor(query.cursor, query.sort, query.descending))
    match = matcher(query.q, query.regex, crashed_before)
    chunk = query.limit + 1 if match is None else FILTER_CHUNK
    kept: list[ListedKey] = []
    while len(kept) <= query.limit:
        keys = run_counters_repository.page_keys(
            session, project=project, key=query.sort, descending=query.descending,
            after=after, limit=chunk, crashed_before=crashed_before)
        kept.extend(key for key in keys if match is None or match(key))
        if len(keys) < chunk:
            break
        after = (keys[-1].sort_value, keys[-1].id)
    shown = kept[:query.limit]
    next_cursor = None
    if len(kept) > query.limit and shown:
        next_cursor = encode_cursor(query.sort, query.descending, shown[-1].sort_value,
                                    shown[-1].id)
    rows = run_counters_repository.page_rows(session, [key.id for key in shown])
    listed = [rows[key.id] for key in shown if key.id in rows]
    total = run_counters_repository.count_runs(session, project) if match is None else None
    return RunsPage(runs=[run for run, _ in listed],
                    counters={run.id: row for run, row in listed if row is not None},
                    next_cursor=next_cursor, total=total)
