"""Pure rolling skip rate: window, repeats, bucket maxima."""

from __future__ import annotations

from ampscope_server import skip_rates


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
