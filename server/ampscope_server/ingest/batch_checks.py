"""Checks of a batch against the run's tables, which pydantic cannot make alone. Pure: no I/O.

The wire models (`wire.py`) check each record on its own; these need the layer table (its
length and each layer's numel) or the module table, stored by an earlier batch or sent in this
one. Data for a table the server does not have is a 409 (send the table); data that does not
fit the table is a 422.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

from ampscope_server.errors import (
    Conflict,
    InvalidPayload,
    LayerTableMissing,
    ModuleTableMissing,
)
from ampscope_server.ingest.wire import StepRecord
from ampscope_server.runs.layer_names import canonical_name
from ampscope_server.store.models import LAYER_STAT_NAMES

LAYER_FIELDS = ("index", "name", "shape", "dtype", "numel", "module_type", "raw_name")
MODULE_FIELDS = ("index", "name", "module_type")


SAME_LAYER: Mapping[str, Callable[[Any, Any], bool]] = {
    "name": lambda stored, sent: canonical_name(stored) == canonical_name(sent)}
"""How a layer's `name` matches: by its canonical name. A run started by a client before
canonical names (issue #13) stored a wrapped model's raw names (`module.fc.weight`); the same
run resumed by a newer client sends `fc.weight` with the same `raw_name`, and is the same table
(and so the other way round). The stored table is kept as it is."""


def compare_tables(
    run_id: str, stored: Sequence[object], sent: Sequence[object], fields: Sequence[str],
    noun: str, error: type[Conflict],
    same: Mapping[str, Callable[[Any, Any], bool]] | None = None,
) -> None:
    """Raise `error` (a 409) unless `sent` equals the stored table field by field (or, for a
    field in `same`, as that says).

    `noun` is "layer" or "module"; the message names the first difference.
    """
    if len(stored) != len(sent):
        raise error(
            f"the {noun} table sent for run '{run_id}' has {len(sent)} {noun}s, "
            f"the stored one has {len(stored)}"
        )
    for index, (old, new) in enumerate(zip(stored, sent, strict=True)):
        for field in fields:
            a, b = getattr(old, field), getattr(new, field)
            if not (a == b or (same is not None and field in same and same[field](a, b))):
                raise error(
                    f"the {noun} table sent for run '{run_id}' differs from the stored one at "
                    f"{noun} {index}: {field} is {getattr(new, field)!r}, "
                    f"stored {getattr(old, field)!r}"
                )


def check_records(
    records: Sequence[StepRecord], run_id: str, layer_numels: Sequence[int] | None,
    num_modules: int | None,
) -> None:
    """Check every record against the tables; `None` means the run has no such table."""
    for position, record in enumerate(records):
        where = f"records[{position}]"
        _check_layer_arrays(record, where, run_id, layer_numels)
        _check_nonfinite(record, where, run_id, layer_numels)
        _check_histogram(record, where, run_id, layer_numels)
        _check_activations(record, where, run_id, num_modules)
        _check_recheck(record, where, run_id, layer_numels)
        _check_swallowed(record, where, run_id, layer_numels)
        _check_shadow(record, where, run_id, layer_numels)
        _check_formats(record, where, run_id, layer_numels)


def _no_layer_table(where: str, what: str, run_id: str) -> LayerTableMissing:
    return LayerTableMissing(
        f"{where} carries {what}, but run '{run_id}' has no layer table yet and this batch "
        "sends none"
    )


def _check_layer_arrays(
    record: StepRecord, where: str, run_id: str, layer_numels: Sequence[int] | None
) -> None:
    if record.layers is None:
        return
    if layer_numels is None:
        raise _no_layer_table(where, "layer statistics", run_id)
    for name in LAYER_STAT_NAMES:
        count = len(getattr(record.layers, name))
        if count != len(layer_numels):
            raise InvalidPayload(
                f"{where}.layers.{name} has {count} entries, but the run's layer table has "
                f"{len(layer_numels)} layers"
            )


def _check_nonfinite(
    record: StepRecord, where: str, run_id: str, layer_numels: Sequence[int] | None
) -> None:
    _check_layer_entries(record.nonfinite, f"{where}.nonfinite", "nonfinite layers", where,
                         run_id, layer_numels)


class _LayerRef(Protocol):
    @property
    def layer(self) -> int: ...


def _check_layer_entries(
    entries: Sequence[_LayerRef] | None, path: str, what: str, where: str, run_id: str,
    layer_numels: Sequence[int] | None,
) -> None:
    """Entries naming a layer by index (``entry.layer``) must fit the run's layer table."""
    if not entries:
        return
    if layer_numels is None:
        raise _no_layer_table(where, what, run_id)
    for i, entry in enumerate(entries):
        if entry.layer >= len(layer_numels):
            raise InvalidPayload(
                f"{path}[{i}].layer is {entry.layer}, but the run's layer table has "
                f"{len(layer_numels)} layers"
            )


def _check_histogram(
    record: StepRecord, where: str, run_id: str, layer_numels: Sequence[int] | None
) -> None:
    histogram = record.histogram
    if histogram is None:
        return
    if layer_numels is None:
        raise _no_layer_table(where, "a histogram", run_id)
    if len(histogram.counts) != len(layer_numels):
        raise InvalidPayload(
            f"{where}.histogram.counts has {len(histogram.counts)} layers, but the run's layer "
            f"table has {len(layer_numels)} layers"
        )
    for index, (counts, numel) in enumerate(zip(histogram.counts, layer_numels, strict=True)):
        total = sum(counts)
        if total != numel:
            raise InvalidPayload(
                f"{where}.histogram.counts[{index}] sums to {total}, but layer {index} has "
                f"numel {numel}"
            )


def _check_activations(
    record: StepRecord, where: str, run_id: str, num_modules: int | None
) -> None:
    if record.activations is None:
        return
    if num_modules is None:
        raise ModuleTableMissing(
            f"{where} carries activation statistics, but run '{run_id}' has no module table "
            "yet and this batch sends none"
        )
    for name in LAYER_STAT_NAMES:
        count = len(getattr(record.activations, name))
        if count != num_modules:
            raise InvalidPayload(
                f"{where}.activations.{name} has {count} entries, but the run's module table "
                f"has {num_modules} modules"
            )


def _check_recheck(
    record: StepRecord, where: str, run_id: str, layer_numels: Sequence[int] | None
) -> None:
    if record.recheck is not None:
        _check_layer_entries(record.recheck.layers, f"{where}.recheck.layers",
                             "re-check layers", where, run_id, layer_numels)


def _check_shadow(
    record: StepRecord, where: str, run_id: str, layer_numels: Sequence[int] | None
) -> None:
    shadow = record.shadow
    if shadow is None or shadow.rel_err is None:
        return
    if layer_numels is None:
        raise _no_layer_table(where, "a shadow step's layers", run_id)
    if len(shadow.rel_err) != len(layer_numels):
        raise InvalidPayload(
            f"{where}.shadow.rel_err has {len(shadow.rel_err)} entries, but the run's layer "
            f"table has {len(layer_numels)} layers"
        )


def _check_formats(
    record: StepRecord, where: str, run_id: str, layer_numels: Sequence[int] | None
) -> None:
    """Each of a `formats` block's layers is a row of the layer table (they are distinct: the
    wire's check), so there are 1 to the table's length of them."""
    formats = record.formats
    if formats is None:
        return
    if layer_numels is None:
        raise _no_layer_table(where, "format what-ifs", run_id)
    for i, layer in enumerate(formats.layers):
        if layer >= len(layer_numels):
            raise InvalidPayload(
                f"{where}.formats.layers[{i}] is {layer}, but the run's layer table has "
                f"{len(layer_numels)} layers"
            )


def _check_swallowed(
    record: StepRecord, where: str, run_id: str, layer_numels: Sequence[int] | None
) -> None:
    if record.swallowed is None:
        return
    if layer_numels is None:
        raise _no_layer_table(where, "swallowed fractions", run_id)
    if len(record.swallowed) != len(layer_numels):
        raise InvalidPayload(
            f"{where}.swallowed has {len(record.swallowed)} entries, but the run's layer table "
            f"has {len(layer_numels)} layers"
        )
