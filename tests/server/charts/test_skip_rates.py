"""Pure rolling skip rate: window, repeats, bucket maxima."""

from __future__ import annotations

from ampscope_server.charts import skip_rates


class TestRollingSkips:
    def test_window_by_step_number(self) -> None:
        rolling = skip_rates.RollingSkips(window=3)
        rates = [rolling.push(step, skipped) for step, skipped in
                 [(0, True), (1, False), (2, False), (3, False), (5, True)]]
        # At step 5 the window (2, 5] holds steps 3 and 5.
        assert rates == [1.0, 0.5, 1 / 3, 0.0, 0.5]
        assert rolling.tail == [(3, False), (5, True)]

    def test_a_repeated_step_is_ignored(self) -> None:
        rolling = skip_rates.RollingSkips(window=10)
        assert rolling.push(4, True) == 1.0
        assert rolling.push(4, False) is None
        assert rolling.push(2, False) is None
        assert rolling.tail == [(4, True)]


class TestBuckets:
    def test_width(self) -> None:
        assert skip_rates.bucket_width(0, 99, 100) == 1
        assert skip_rates.bucket_width(0, 100, 100) == 2
        assert skip_rates.bucket_width(10, 10, 5) == 1

    def test_a_burst_is_kept_as_the_bucket_maximum(self) -> None:
        flags = [(step, step in (10, 11)) for step in range(40)]
        points, rolling = skip_rates.rolling_max(flags, window=4, first=0, width=20)
        # Bucket 0 (steps 0-19) peaks at 2 skipped of 4; bucket 1 (20-39) has none.
        assert points == [(0, 0.5), (20, 0.0)]
        assert rolling.tail == [(36, False), (37, False), (38, False), (39, False)]

    def test_empty(self) -> None:
        points, rolling = skip_rates.rolling_max([], window=4, first=0, width=1)
        assert points == [] and rolling.tail == []


LEVELS = (4, 6, 8, 10, 12, 14, 16)


class TestBlocks:
    def test_the_widest_unit_with_four_in_the_window(self) -> None:
        assert skip_rates.blocks(100, 200_000, LEVELS) == skip_rates.Blocks(4, 6)
        assert skip_rates.blocks(1000, 1_000_000, LEVELS) == skip_rates.Blocks(6, 15)
        assert skip_rates.blocks(256, 20_000, LEVELS) == skip_rates.Blocks(6, 4)

    def test_else_the_widest_that_fits(self) -> None:
        assert skip_rates.blocks(16, 20_000, LEVELS) == skip_rates.Blocks(4, 1)
        assert skip_rates.blocks(63, 20_000, LEVELS) == skip_rates.Blocks(4, 3)

    def test_none_under_the_finest(self) -> None:
        assert skip_rates.blocks(15, 20_000, LEVELS) is None

    def test_coarser_when_the_range_holds_too_many_units(self) -> None:
        # 1M steps hold 62,500 units of 16 steps, more than MAX_BLOCK_ROWS: 64-step units.
        assert skip_rates.blocks(100, 1_000_000, LEVELS) == skip_rates.Blocks(6, 1)
        assert skip_rates.blocks(100, 1 << 22, LEVELS) == skip_rates.Blocks(6, 1)
        # ... but never wider than the window.
        assert skip_rates.blocks(40, 1 << 30, LEVELS) == skip_rates.Blocks(4, 2)
        assert skip_rates.blocks(100, 1 << 22, LEVELS).unit == 64  # type: ignore[union-attr]


class TestColumnPoints:
    def test_highest_per_column_and_the_last_column_clamped(self) -> None:
        columns = [(0, 0.25), (2, 0.5), (2, 0.125), (3, 1.0), (4, 0.75)]
        # first 100, last 139, width 10: columns 0..3; a block ending past 139 counts in 3.
        assert skip_rates.column_points(columns, 100, 139, 10) == [
            (100, 0.25), (120, 0.5), (130, 1.0)]

    def test_empty(self) -> None:
        assert skip_rates.column_points([], 0, 99, 10) == []


class TestRatesFrom:
    def test_the_window_filled_from_earlier_flags(self) -> None:
        flags = [(step, step in (3, 4)) for step in range(2, 9)]
        assert list(skip_rates.rates_from(flags, 4, since=5)) == [
            (5, 0.5), (6, 0.5), (7, 0.25), (8, 0.0)]
