"""Chart reads: downsampled series, scale events, layer-by-step heatmaps.

The math is in `series.py` (pure); this module fetches rows and shapes the responses.
"""

from __future__ import annotations

from sqlalchemy.orm import Session

from ampscope_server import codec, repository, series
from ampscope_server.formats import FORMATS
from ampscope_server.models import Run
from ampscope_server.schemas import (
    EventRead,
    EventsRead,
    HeatmapRead,
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
    rows = [
        (int(step), bool(skipped), codec.from_storage(before, before_cls),
         codec.from_storage(after, after_cls))
        for step, skipped, before, before_cls, after, after_cls
        in repository.event_rows(session, run.id)
    ]
    return EventsRead(events=[
        EventRead(step=e.step, kind=e.kind,
                  scale_before=e.scale_before, scale_after=e.scale_after)
        for e in series.scale_events(rows)
    ])


def heatmap_read(
    session: Session, run: Run, stat: HeatmapStat, start: int | None, end: int | None
) -> HeatmapRead:
    """z[layer][column]: one column per step that has layer statistics, in step order."""
    fmt = FORMATS[run.target_format]
    layer_names = [layer.name for layer in repository.get_layers(session, run.id)]
    if stat == "lost_frac":
        columns = ["zero_frac", "underflow_frac"]
    elif stat == "headroom_bits":
        columns = ["amax"]
    else:
        columns = [stat]
    z: list[list[float | None]] = [[] for _ in layer_names]
    steps: list[int] = []
    current = None
    for step_id, step, scale, scale_cls, layer_index, *values in repository.heatmap_rows(
        session, run.id, columns, start, end
    ):
        if step_id != current:
            current = step_id
            steps.append(int(step))
            for row in z:
                row.append(None)
        if stat == "lost_frac":
            value: float | None = series.lost_frac(values[0], values[1])
        elif stat == "headroom_bits":
            value = series.headroom_bits(values[0], codec.from_storage(scale, scale_cls), fmt)
        else:
            value = values[0]
        if layer_index < len(z):
            z[layer_index][-1] = value
    return HeatmapRead(stat=stat, layers=layer_names, steps=steps, z=z)
