"""GET /api/runs: keyset pages, server-side order and filter, bad cursors; the socket snapshot.

Each test names its runs with a project of its own and filters on it, so the module's shared
app and database (other tests' runs) do not disturb the exact expectations.
"""

from __future__ import annotations

import re
import uuid
from typing import Any

import httpx2
import pytest
from sqlalchemy import inspect as sa_inspect
from sqlalchemy.orm import Session, sessionmaker
from starlette.testclient import TestClient

from ampscope_server.errors import InvalidPayload
from ampscope_server.runs import listing as runs_list
from tests.server.wire import batch, new_id, record, strict_json
from tests.support.app import WS_BASE_URL
from tests.support.ingest import ingest_payload


def _project() -> str:
    return f"p{uuid.uuid4().hex[:10]}"


def _seed(api: TestClient, project: str, name: str, steps: int, skipped: int = 0,
          tags: list[str] | None = None) -> str:
    run_id = new_id()
    records = [record(i, skipped=i < skipped, found_inf=i < skipped) for i in range(steps)]
    response = api.post("/api/ingest", json=batch(records, run_id=run_id, project=project,
                                                  name=name, tags=tags or []))
    assert response.status_code == 200, response.text
    return run_id


def _next(response: httpx2.Response) -> str | None:
    found = re.fullmatch(r'<([^>]+)>; rel="next"', response.headers.get("Link", ""))
    return None if found is None else found.group(1)


def _walk(api: TestClient, path: str) -> tuple[list[list[dict[str, Any]]], list[str]]:
    """Every page from `path` on, following the Link header; (pages, the links followed)."""
    pages, links = [], []
    next_path: str | None = path
    while next_path is not None:
        response = api.get(next_path)
        assert response.status_code == 200, response.text
        pages.append(strict_json(response.text))
        next_path = _next(response)
        if next_path is not None:
            links.append(next_path)
    return pages, links


class TestPages:
    def test_pages_cover_every_run_once_in_order(self, api: TestClient) -> None:
        project = _project()
        ids = [_seed(api, project, f"run-{i}", steps=1) for i in range(7)]
        pages, links = _walk(api, f"/api/runs?limit=3&q={project}")
        assert [len(page) for page in pages] == [3, 3, 1]
        # Newest first, as before pagination.
        assert [run["id"] for page in pages for run in page] == ids[::-1]
        assert all("cursor=" in link and f"q={project}" in link for link in links)

    def test_unfiltered_pages_carry_the_total(self, api: TestClient) -> None:
        _seed(api, _project(), "counted", steps=1)
        response = api.get("/api/runs?limit=1")
        total = int(response.headers["X-Total-Count"])
        pages, _ = _walk(api, "/api/runs?limit=50")
        listed = [run["id"] for page in pages for run in page]
        assert len(listed) == len(set(listed)) == total >= 1
        assert len(strict_json(response.text)) == 1 and _next(response) is not None
        # Filtered: no total (counting the matches would read every run).
        assert "X-Total-Count" not in api.get("/api/runs?q=counted").headers

    def test_a_run_added_between_pages_is_neither_lost_nor_repeated(
        self, api: TestClient
    ) -> None:
        project = _project()
        old = [_seed(api, project, f"old-{i}", steps=1) for i in range(4)]
        first = api.get(f"/api/runs?limit=2&q={project}")
        newer = _seed(api, project, "newer", steps=1)
        rest, _ = _walk(api, str(_next(first)))
        assert [r["id"] for r in strict_json(first.text)] == old[:1:-1]
        assert [r["id"] for page in rest for r in page] == old[1::-1]
        assert newer not in {r["id"] for page in rest for r in page}

    @pytest.mark.parametrize(("sort", "order", "key"), [
        ("steps", "desc", lambda r: (-r["num_steps"], r["id"])),
        ("steps", "asc", lambda r: (r["num_steps"], r["id"])),
        ("skip_rate", "desc", lambda r: (-r["skip_rate"], r["id"])),
        ("name", "asc", lambda r: (r["name"].lower(), r["id"])),
        ("updated", "desc", lambda r: (-r["updated_at"], r["id"])),
    ])
    def test_sorted_on_the_server_across_pages(
        self, api: TestClient, sort: str, order: str, key: Any
    ) -> None:
        project = _project()
        for i, (steps, skipped) in enumerate([(5, 1), (2, 0), (9, 3), (1, 1), (5, 0)]):
            _seed(api, project, f"{'bcaed'[i]}-run", steps=steps, skipped=skipped)
        pages, _ = _walk(api, f"/api/runs?limit=2&sort={sort}&order={order}&q={project}")
        listed = [run for page in pages for run in page]
        assert len(listed) == 5
        assert listed == sorted(listed, key=key)

    def test_runs_without_steps_sort_last_either_way(self, api: TestClient) -> None:
        project = _project()
        empty = new_id()
        response = api.post("/api/ingest", json=batch([], run_id=empty, project=project))
        assert response.status_code == 200
        with_steps = _seed(api, project, "steps", steps=2, skipped=1)
        for order in ("asc", "desc"):
            pages, _ = _walk(api, f"/api/runs?limit=1&sort=skip_rate&order={order}&q={project}")
            assert [r["id"] for page in pages for r in page] == [with_steps, empty]


class TestFilter:
    def test_words_match_name_project_tag_or_status_on_the_server(
        self, api: TestClient
    ) -> None:
        project = _project()
        tagged = _seed(api, project, "alpha", steps=1, tags=["Vision"])
        plain = _seed(api, project, "beta", steps=1)
        by_words = api.get(f"/api/runs?q={project}+vision")
        assert [r["id"] for r in strict_json(by_words.text)] == [tagged]
        both = api.get(f"/api/runs?q={project}+active")
        assert [r["id"] for r in strict_json(both.text)] == [plain, tagged]

    def test_the_filter_applies_before_the_page_is_cut(self, api: TestClient) -> None:
        """The matches are found beyond the first page of unfiltered runs."""
        project = _project()
        wanted = _seed(api, project, "needle", steps=1)
        for i in range(5):
            _seed(api, project, f"hay-{i}", steps=1)
        response = api.get(f"/api/runs?limit=2&q={project}+needle")
        assert [r["id"] for r in strict_json(response.text)] == [wanted]
        assert _next(response) is None

    def test_regex(self, api: TestClient) -> None:
        project = _project()
        hit = _seed(api, project, "exp-042", steps=1)
        _seed(api, project, "exp-42b", steps=1)
        response = api.get("/api/runs", params={"q": r"^EXP-\d{3}$", "regex": "true"})
        assert hit in {r["id"] for r in strict_json(response.text)}
        assert all(re.search(r"^exp-\d{3}$", r["name"], re.I) for r in strict_json(response.text)
                   if r["project"] == project)

    def test_an_invalid_regex_is_422_with_the_reason(self, api: TestClient) -> None:
        response = api.get("/api/runs", params={"q": "img([", "regex": "true"})
        assert response.status_code == 422
        assert response.json()["detail"].startswith("q: invalid regular expression: ")


class TestCursor:
    def test_a_forged_cursor_is_422(self, api: TestClient) -> None:
        response = api.get("/api/runs", params={"cursor": "not-a-cursor"})
        assert response.status_code == 422
        assert response.json()["detail"] == ("cursor: not a cursor this server gave (pass the "
                                              "`next` link of the previous page unchanged)")

    def test_a_cursor_of_another_order_is_422(self, api: TestClient) -> None:
        cursor = runs_list.encode_cursor("steps", True, 3, "x")
        response = api.get("/api/runs", params={"cursor": cursor, "sort": "name"})
        assert response.status_code == 422
        assert response.json()["detail"] == ("cursor: made for sort=steps order=desc, but this "
                                              "request asks sort=name order=desc")

    def test_round_trip(self) -> None:
        cursor = runs_list.encode_cursor("started", False, 1764430001.123456789, "r-1")
        assert runs_list.decode_cursor(cursor, "started", False) == (1764430001.123456789, "r-1")

    @pytest.mark.parametrize("payload", [
        '["started","desc",null,"r"]', '["started","desc",true,"r"]',
        '["started","desc",1,7]', '["started","desc",NaN,"r"]', '[1,2]', '{}',
        '["started","desc","a\\u0000","r"]', '["started","desc",1,"r\\u0000"]',
    ])
    def test_rejects_values_no_page_gives(self, payload: str) -> None:
        import base64
        cursor = base64.urlsafe_b64encode(payload.encode()).decode()
        with pytest.raises(InvalidPayload):
            runs_list.decode_cursor(cursor, "started", True)


class TestSnapshot:
    def test_the_socket_snapshot_is_the_first_page_and_its_cursor(self, api: TestClient) -> None:
        for i in range(3):
            _seed(api, _project(), f"snap-{i}", steps=1)
        with api.websocket_connect(f"{WS_BASE_URL}/api/runs/live") as ws:
            snapshot = strict_json(ws.receive_text())  # sent on connect: no wait to bound
        first = api.get(f"/api/runs?limit={runs_list.DEFAULT_LIMIT}")
        page_ids = [r["id"] for r in strict_json(first.text)]
        snapshot_ids = [r["id"] for r in snapshot["runs"]]
        assert snapshot["full"] is True
        assert snapshot_ids == page_ids
        assert snapshot["total"] == int(first.headers["X-Total-Count"])
        link = _next(first)
        assert (snapshot["next_cursor"] is None) == (link is None)
        # Apart: the active runs beyond the first page (the status of those may age).
        assert not {r["id"] for r in snapshot["active"]} & set(page_ids)
        assert all(r["status"] in ("active", "crashed") for r in snapshot["active"])


class TestPageReads:
    def test_a_page_loads_its_own_runs_without_their_config(
        self, sessions: sessionmaker[Session]
    ) -> None:
        """The key walk reads short columns; only the page's runs are loaded, config unread
        (a summary never shows it), with the counters rows they were read with."""
        project = _project()
        big = {"notes": "x" * 60_000}
        ids = []
        for i in range(5):
            run_id = new_id()
            payload = batch([record(0, with_layers=False)], run_id=run_id, project=project,
                            name=f"r{i}", config=big)
            ingest_payload(sessions, payload)
            ids.append(run_id)
        with sessions() as session:
            found = runs_list.runs_page(session, runs_list.RunsQuery(limit=3, q=project), None,
                                   crashed_before=0.0)
            assert [run.id for run in found.runs] == ids[::-1][:3]
            assert all("config" in sa_inspect(run).unloaded for run in found.runs)
            assert sorted(found.counters) == sorted(ids[::-1][:3])
            assert all(found.counters[run.id].num_steps == 1 for run in found.runs)
