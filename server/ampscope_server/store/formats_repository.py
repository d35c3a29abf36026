"""Repository: wire v7's scaled-format what-ifs (`step_formats`, one row per sampled step).
Functions take a Session and never commit.

The reads are bounded by the screen, not by the run: a run's sampled steps are thinned in SQL
(`format_packing.thinned`'s rule, one statement with the count beside each row, so the rule and
the count see the same rows), and a trend cuts one (layer, operand, recipe)'s 72 bytes out of
each kept row in SQL (`format_packing.value_at`, `operand_at`), and its 136 bytes of block
scale exponents (`scales_at`): no blob is read whole but the one step a matrix shows.
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import (
    ColumnElement,
    Integer,
    Select,
    String,
    and_,
    case,
    cast,
    func,
    literal,
    or_,
    select,
)
from sqlalchemy.orm import InstrumentedAttribute, Session, defer

from ampscope_server.store import format_packing
from ampscope_server.store.models import StepFormats
from ampscope_server.store.sql_support import is_postgres, run_key


@dataclass(frozen=True, slots=True)
class Sampled:
    """A run's sampled steps as a bounded read keeps them: `count` of them in all, `steps` the
    (step id, step) of those kept, in step then ingest order."""

    count: int
    steps: list[tuple[int, int]]


@dataclass(frozen=True, slots=True)
class TrendRow:
    """One kept sampled step's cut of a row: its five format statistics, four operand
    statistics and `SCALE_WIDTH` block scale exponents (None: a client before wire v8) for one
    (layer, operand, recipe), little-endian float64 bytes."""

    step_id: int
    step: int
    values: bytes
    operands: bytes
    scales: bytes | None


_NO_SCALES = defer(StepFormats.scales, raiseload=True)
"""The matrix, the verdicts and the outlier findings read whole rows but never the block scale
exponents (a 100-layer, 6-recipe sample's 244,800 bytes): not loaded, and an access raises."""


def formats_first(session: Session, run_id: str, count: int) -> list[StepFormats]:
    """The run's first `count` sampled steps, in step order, without their `scales`
    (`_NO_SCALES`). One walk of the index forwards."""
    return list(session.scalars(
        select(StepFormats).options(_NO_SCALES).where(StepFormats.run_key == run_key(run_id))
        .order_by(StepFormats.step, StepFormats.step_id).limit(count)))


def formats_up_to(session: Session, run_id: str, step: int | None, count: int
                  ) -> list[StepFormats]:
    """The run's last `count` sampled steps at or before `step` (None: its end), latest first
    (of equal steps the latest ingested), without their `scales` (`_NO_SCALES`); none when
    there is none. One walk of (run_key, step, step_id) backwards."""
    query = select(StepFormats).options(_NO_SCALES).where(StepFormats.run_key == run_key(run_id))
    if step is not None:
        query = query.where(StepFormats.step <= step)
    return list(session.scalars(
        query.order_by(StepFormats.step.desc(), StepFormats.step_id.desc()).limit(count)))


def _thinned(run_id: str, limit: int) -> Select[tuple[int, int, int]]:
    """(step id, step, count) of the run's sampled steps that a read of at most `limit` (≥ 2)
    keeps (`format_packing.thinned`): all when there are at most `limit`, else position p (in
    step then ingest order) when p = 0 or its bucket p·(limit-1) // (count-1) differs from
    p-1's. Read from the index (run_key, step, step_id) alone."""
    ranked = select(
        StepFormats.step_id, StepFormats.step,
        (func.row_number().over(order_by=(StepFormats.step, StepFormats.step_id)) - 1
         ).label("pos"),
        func.count().over().label("n"),
    ).where(StepFormats.run_key == run_key(run_id)).subquery()
    span = limit - 1
    # Never 0, whatever the database evaluates first: n = 1 is kept by `n <= limit` anyway.
    width = case((ranked.c.n > 1, ranked.c.n - 1), else_=1)

    def bucket(position: ColumnElement[int]) -> ColumnElement[int]:
        return (position * span) // width

    return select(ranked.c.step_id, ranked.c.step, ranked.c.n).where(or_(
        ranked.c.n <= limit, ranked.c.pos == 0, bucket(ranked.c.pos) != bucket(ranked.c.pos - 1)))


def sampled_steps(session: Session, run_id: str, limit: int) -> Sampled:
    """The run's sampled steps, at most `limit` (≥ 2) of them, thinned evenly (`_thinned`)."""
    thinned = _thinned(run_id, limit).subquery()
    rows = session.execute(select(thinned).order_by(thinned.c.step, thinned.c.step_id)).all()
    return Sampled(int(rows[0].n) if rows else 0,
                   [(int(step_id), int(step)) for step_id, step, _ in rows])


Text = ColumnElement[str] | InstrumentedAttribute[str]


def _commas(text: Text) -> ColumnElement[int]:
    return (func.length(text, type_=Integer)
            - func.length(func.replace(text, ",", "", type_=String), type_=Integer))


def _index_in(session: Session, column: Text, item: str
              ) -> tuple[ColumnElement[int], ColumnElement[int]]:
    """(where `item` is in the comma-joined `column`, 1-based, 0 when absent; its index there):
    the commas before it, in ",<column>," searched for ",<item>,"."""
    framed = literal(",", String) + column + literal(",", String)
    find = func.strpos if is_postgres(session) else func.instr
    at = find(framed, f",{item},", type_=Integer)
    return at, _commas(func.substr(framed, 1, at, type_=String)) - 1


def trend_rows(session: Session, run_id: str, limit: int, layer: int, operand: int,
               recipe: str) -> tuple[int, list[TrendRow]]:
    """(how many sampled steps the run has, the cut of each kept one that recorded `layer` and
    `recipe`), in one statement: the sampled steps thinned as `sampled_steps` thins them, and
    of each of their rows only the 5 + 4 (+ 17 block scale exponents) float64 values of
    (`layer`, `operand` (its index in OPERANDS), `recipe`), cut out by the database at the
    offsets the row's own `layers` and `recipes` give (null where the row lacks either).
    `recipe` must hold no comma (the read checks it against RECIPE_PATTERN)."""
    thinned = _thinned(run_id, limit).subquery()
    at_layer, position = _index_in(session, StepFormats.layers, str(layer))
    at_recipe, index = _index_in(session, StepFormats.recipes, recipe)
    found = and_(at_layer > 0, at_recipe > 0)
    layers = _commas(StepFormats.layers) + 1
    recipes = _commas(StepFormats.recipes) + 1
    values = format_packing.value_at(position, operand, index, recipes)
    operands = format_packing.operand_at(position, operand, layers, recipes)
    scales = format_packing.scales_at(position, operand, index, recipes)
    rows = session.execute(
        select(thinned.c.step_id, thinned.c.step, thinned.c.n,
               case((found, func.substr(StepFormats.data, cast(values + 1, Integer),
                                        format_packing.STATS_BYTES))),
               case((found, func.substr(StepFormats.data, cast(operands + 1, Integer),
                                        format_packing.OPERAND_BYTES))),
               case((found, func.substr(StepFormats.scales, cast(scales + 1, Integer),
                                        format_packing.SCALES_BYTES))))
        .join_from(thinned, StepFormats, StepFormats.step_id == thinned.c.step_id)
        .order_by(thinned.c.step, thinned.c.step_id)).all()
    return (int(rows[0].n) if rows else 0,
            [TrendRow(int(step_id), int(step), bytes(cut_values), bytes(cut_operands),
                      None if cut_scales is None else bytes(cut_scales))
             for step_id, step, _, cut_values, cut_operands, cut_scales in rows
             if cut_values is not None])
