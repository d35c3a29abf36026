"""Downloads of a run: the JSON, long-format and wide CSV streams and the attachment filename.

The JSON is `ExportRead` (run, layers, modules, steps), written step by step. The CSV is the
run's full, unsampled data, one row per value (docs/contracts.md "Export"):
`step,attempt,seq,wall_time,source,layer_index,layer,stat,value`. The wide CSV has one row per
step: its scalars, then a column per layer and statistic (`<layer>/<stat>`, empty on steps
without layer statistics): a spreadsheet's or pandas' shape, a fraction of the long one's size.
All are produced page by page
from their own session, so memory stays bounded however long the run: a page holds at most
`PAGE_VALUES` per-layer rows.
"""

from __future__ import annotations

import csv
import io
import json
import math
import re
from collections.abc import Iterator, Sequence

from sqlalchemy.orm import Session, sessionmaker

from ampscope_server.ingest.wire import ModuleInfo
from ampscope_server.runs import json_floats
from ampscope_server.runs import reads as runs
from ampscope_server.store import runs_repository, steps_repository
from ampscope_server.store.float_storage import from_storage
from ampscope_server.store.models import CLASSED_ACTIVATION_STATS, LAYER_STAT_NAMES, Run, Step

CSV_COLUMNS = ("step", "attempt", "seq", "wall_time", "source", "layer_index", "layer", "stat",
               "value")
# The step scalars, in the order each step's rows list them.
SCALAR_STATS = ("loss", "scale_before", "scale_after", "growth_tracker", "found_inf", "skipped",
                "grad_norm", "lr", "duration")
PAGE_VALUES = 50_000
"""Per-layer (or per-module) rows a CSV page reads at most (each carries the eight statistics)."""
JSON_PAGE_VALUES = 5_000
"""The same for a JSON page, smaller: each row there also becomes ORM and pydantic objects
(about 1 KiB each), so 4 exports at once stay well inside 64 MiB
(docs/storage.md#smaller-notes-moved-from-the-code)."""

_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")


def cell(value: float | int | bool | None) -> str:
    """A value as CSV text: "" for absent, 1/0 for booleans, "nan"/"inf"/"-inf", else exact."""
    if value is None:
        return ""
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, int):
        return str(value)
    if math.isfinite(value):
        return repr(value)  # the shortest text that reads back as the same double
    encoded = json_floats.encode(value)
    assert isinstance(encoded, str)
    return encoded


def attachment_filename(run: Run, extension: str) -> str:
    """`<name>-<id8>.<ext>` with every character outside [A-Za-z0-9._-] replaced by `_`.

    Safe for a Content-Disposition header and every file system: no quotes, slashes or
    control characters, no leading dot, at most 80 characters of name.
    """
    name = _UNSAFE.sub("_", run.name).strip("._-")[:80] or "run"
    short_id = _UNSAFE.sub("_", run.id)[:8] or "run"
    return f"{name}-{short_id}.{extension}"


def content_disposition(run: Run, extension: str) -> str:
    return f'attachment; filename="{attachment_filename(run, extension)}"'


def _step_rows(step: Step, ordinal: int) -> list[list[str]]:
    head = [str(step.step), str(ordinal), str(step.seq), cell(step.wall_time)]
    rows = []
    for name in SCALAR_STATS:
        value: float | int | bool | None = getattr(step, name)
        if name in ("loss", "scale_before", "scale_after", "grad_norm", "lr", "duration"):
            value = from_storage(getattr(step, name), getattr(step, f"{name}_class"))
        rows.append([*head, "step", "", "", name, cell(value)])
    return rows


def _stat_rows(
    head: list[str], source: str, index: int, name: str, values: Sequence[float | int | None]
) -> list[list[str]]:
    return [
        [*head, source, str(index), name, stat, cell(value)]
        for stat, value in zip(LAYER_STAT_NAMES, values, strict=True)
    ]


def _page_steps(session: Session, run_id: str, page_values: int) -> int:
    """Steps per page so that a page holds about `page_values` per-layer and per-module rows."""
    width = (len(runs_repository.get_layers(session, run_id))
             + len(runs_repository.get_modules(session, run_id)))
    return max(1, page_values // max(1, width))


def json_chunks(
    factory: sessionmaker[Session], run_id: str, crash_timeout_s: float,
    page_values: int = JSON_PAGE_VALUES,
) -> Iterator[str]:
    """The JSON export (`ExportRead`'s document, the same bytes a single dump would give in
    structure) as text chunks: the head, then each page of steps."""
    with factory() as session:
        run = runs.load_run(session, run_id)
        head = {
            "run": runs.detail(session, run, crash_timeout_s).model_dump(mode="json"),
            "layers": [layer.model_dump(mode="json") for layer in runs.layers(session, run)],
            "modules": [ModuleInfo.model_validate(module).model_dump(mode="json")
                        for module in runs_repository.get_modules(session, run_id)],
        }
        yield json.dumps(head, allow_nan=False)[:-1] + ', "steps": ['
        limit = _page_steps(session, run_id, page_values)
        after_id, first = 0, True
        while True:
            page = runs.export_steps(session, run_id, after_id, limit)
            if page:
                text = ",".join(step.model_dump_json() for step in page)
                yield text if first else "," + text
                first = False
                after_id = page[-1].id
            session.expunge_all()
            if len(page) < limit:
                break
    yield "]}"


def csv_chunks(
    factory: sessionmaker[Session], run_id: str, page_values: int = PAGE_VALUES
) -> Iterator[str]:
    """The CSV text of a run, one chunk per page of steps, in ingest order.

    Within a step: its scalars (SCALAR_STATS order), then each layer's statistics (layer order,
    then LAYER_STAT_NAMES order), then each module's activation statistics likewise.
    """
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(CSV_COLUMNS)
    yield buffer.getvalue()
    with factory() as session:
        layers = runs_repository.layer_names(session, run_id)
        modules = [module.name for module in runs_repository.get_modules(session, run_id)]
        limit = max(1, page_values // max(1, len(layers) + len(modules)))
        after_id = 0
        while True:
            page = steps_repository.steps_after(session, run_id, after_id, limit)
            if not page:
                return
            ids = [step.id for step, _ in page]
            params: dict[int, list[tuple[int, list[float | int | None]]]] = {}
            for stat in steps_repository.layer_stats_of(session, ids):
                params.setdefault(stat.step_id, []).append((
                    stat.layer_index, [getattr(stat, name) for name in LAYER_STAT_NAMES]))
            activations: dict[int, list[tuple[int, list[float | int | None]]]] = {}
            for act in steps_repository.activation_stats_of(session, ids):
                activations.setdefault(act.step_id, []).append((act.module_index, [
                    from_storage(getattr(act, name), getattr(act, f"{name}_class"))
                    if name in CLASSED_ACTIVATION_STATS else getattr(act, name)
                    for name in LAYER_STAT_NAMES]))
            buffer.seek(0)
            buffer.truncate()
            for step, ordinal in page:
                scalar_rows = _step_rows(step, ordinal)
                writer.writerows(scalar_rows)
                head = scalar_rows[0][:4]
                for index, values in params.get(step.id, ()):
                    name = layers[index] if index < len(layers) else ""
                    writer.writerows(_stat_rows(head, "param", index, name, values))
                for index, values in activations.get(step.id, ()):
                    name = modules[index] if index < len(modules) else ""
                    writer.writerows(_stat_rows(head, "activation", index, name, values))
            yield buffer.getvalue()
            after_id = page[-1][0].id
            # The identity map only holds weak references, but a long export should not even
            # keep the last page's objects reachable through the session.
            session.expunge_all()


def wide_csv_chunks(
    factory: sessionmaker[Session], run_id: str, page_values: int = PAGE_VALUES
) -> Iterator[str]:
    """The wide CSV text of a run (module docstring), one chunk per page of steps, in ingest
    order. Parameter-gradient statistics only: the sampled activation ones are in the long CSV."""
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    with factory() as session:
        layers = runs_repository.layer_names(session, run_id)
        writer.writerow([*CSV_COLUMNS[:4], *SCALAR_STATS,
                         *(f"{layer}/{stat}" for layer in layers for stat in LAYER_STAT_NAMES)])
        yield buffer.getvalue()
        limit = max(1, page_values // max(1, len(layers)))
        empty = [""] * len(LAYER_STAT_NAMES)
        after_id = 0
        while True:
            page = steps_repository.steps_after(session, run_id, after_id, limit)
            if not page:
                return
            params: dict[int, dict[int, list[str]]] = {}
            for stat in steps_repository.layer_stats_of(session, [step.id for step, _ in page]):
                params.setdefault(stat.step_id, {})[stat.layer_index] = [
                    cell(getattr(stat, name)) for name in LAYER_STAT_NAMES]
            buffer.seek(0)
            buffer.truncate()
            for step, ordinal in page:
                scalars = _step_rows(step, ordinal)
                by_layer = params.get(step.id, {})
                writer.writerow([*scalars[0][:4], *(row[-1] for row in scalars),
                                 *(v for index in range(len(layers))
                                   for v in by_layer.get(index, empty))])
            yield buffer.getvalue()
            after_id = page[-1][0].id
            session.expunge_all()
