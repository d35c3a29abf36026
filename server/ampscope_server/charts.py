"""Chart reads: downsampled series, scale events, layer-by-step heatmaps.

The math is in `series.py` (pure); this module fetches rows and shapes the responses.
"""

from __future__ import annotations

from sqlalchemy.orm import Session

from ampscope_server import codec, events, repository, series
from ampscope_server.formats import FORMATS
from ampscope_server.models import CLASSED_ACTIVATION_STATS, Run
from ampscope_server.schemas import (
    EventsRead,
    HeatmapRead,
    HeatmapSource,
    HeatmapStat,
    SeriesName,
    SeriesPointRead,
    SeriesRead,
)

# "scale" charts the scale in effect during each step, i.e. before update().
SERIES_COLUMNS: dict[str, str] = {
    "scale": "scale_before", "loss": "loss", "grad_norm": "grad_norm", "lr": "lr",
    "duration": "duration",
}


def series_read(
    session: Session, run: Run, name: SeriesName, max_points: int, start: int | None,
    end: int | None,
) -> SeriesRead:
    rows = repository.series_rows(session, run.id, SERIES_COLUMNS[name], start, end)
    pairs = [(int(step), codec.from_storage(value, cls)) for step, value, cls in rows]
    present = [(step, value) for step, value in pairs if value is not None]
    points, downsampled = series.downsample(
        [step for step, _ in present], [value for _, value in present], max_points
    )
    return SeriesRead(
        name=name, downsampled=downsampled,
        points=[SeriesPointRead(step=p.step, min=p.min, max=p.max, last=p.last) for p in points],
    )


def events_read(session: Session, run: Run) -> EventsRead:
    steps = [
        events.StepRow(
            step_id=int(step_id), step=int(step), skipped=bool(skipped),
            scale_before=codec.from_storage(before, before_cls),
            scale_after=codec.from_storage(after, after_cls),
            loss=codec.from_storage(loss, loss_cls),
        )
        for step_id, step, skipped, before, before_cls, after, after_cls, loss, loss_cls
        in repository.event_rows(session, run.id)
    ]
    bad_layers: dict[int, list[tuple[int, str]]] = {}
    for entry in repository.nonfinite_of(session, [s.step_id for s in steps if s.skipped]):
        bad_layers.setdefault(entry.step_id, []).append((entry.layer_index, entry.kind))
    misuse = [
        events.MisuseRow(
            step_id=int(step_id), step=int(step),
            scale_before=codec.from_storage(before, before_cls),
            scale_after=codec.from_storage(after, after_cls), kind=kind, detail=detail,
        )
        for step_id, step, before, before_cls, after, after_cls, kind, detail
        in repository.misuse_rows(session, run.id)
    ]
    names = [layer.name for layer in repository.get_layers(session, run.id)]
    return EventsRead(events=events.build_events(steps, misuse, bad_layers, names))


def _heatmap_columns(source: HeatmapSource, stat: HeatmapStat) -> list[str]:
    """The stored columns a stat is read or derived from (with classes where stored)."""
    if stat == "lost_frac":
        return ["zero_frac", "underflow_frac"]
    base = "amax" if stat == "headroom_bits" else stat
    if source == "activation" and base in CLASSED_ACTIVATION_STATS:
        return [base, f"{base}_class"]
    return [base]


def heatmap_read(
    session: Session, run: Run, stat: HeatmapStat, start: int | None, end: int | None,
    source: HeatmapSource = "param",
) -> HeatmapRead:
    """z[row][column]: a row per layer (param) or module (activation), a column per step that
    has statistics of that source, in step order."""
    fmt = FORMATS[run.target_format]
    table = (
        repository.get_modules(session, run.id) if source == "activation"
        else repository.get_layers(session, run.id)
    )
    names = [entry.name for entry in table]
    columns = _heatmap_columns(source, stat)
    classed = len(columns) == 2 and columns[1].endswith("_class")
    z: list[list[float | None]] = [[] for _ in names]
    steps: list[int] = []
    current = None
    for step_id, step, scale, scale_cls, index, *values in repository.heatmap_rows(
        session, run.id, source, columns, start, end
    ):
        if step_id != current:
            current = step_id
            steps.append(int(step))
            for row in z:
                row.append(None)
        if stat == "lost_frac":
            value: float | None = series.lost_frac(values[0], values[1])
        else:
            value = codec.from_storage(values[0], values[1]) if classed else values[0]
            if stat == "headroom_bits":
                value = series.headroom_bits(value, codec.from_storage(scale, scale_cls), fmt)
        if index < len(z):
            z[index][-1] = value
    return HeatmapRead(stat=stat, source=source, layers=names, steps=steps, z=z)
