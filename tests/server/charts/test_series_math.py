from __future__ import annotations

import math

import pytest

from ampscope_server.charts.series_math import (
    ScaleEvent,
    SeriesPoint,
    bucket_bounds,
    downsample,
    headroom_bits,
    lost_frac,
    scale_events,
)
from ampscope_server.findings.formats import FORMATS


class TestBucketBounds:
    def test_contiguous_ranges_cover_every_index_and_skip_empty_buckets(self) -> None:
        # span 0..11 in 3 buckets of 4 steps: [0, 4), [4, 8) has no step, [8, 12)
        assert bucket_bounds([0, 1, 3, 9, 10, 11], 3) == [(0, 3), (3, 6)]
        assert bucket_bounds([0, 4, 8], 3) == [(0, 1), (1, 2), (2, 3)]

    def test_empty_and_invalid(self) -> None:
        assert bucket_bounds([], 5) == []
        with pytest.raises(ValueError, match="max_buckets must be at least 1, got 0"):
            bucket_bounds([1], 0)


class TestDownsample:
    def test_empty(self) -> None:
        assert downsample([], [], 10) == ([], False)

    def test_short_series_is_returned_as_is(self) -> None:
        points, downsampled = downsample([0, 1, 2], [1.0, 2.0, 3.0], 3)
        assert not downsampled
        assert points == [SeriesPoint(0, 1.0, 1.0, 1.0), SeriesPoint(1, 2.0, 2.0, 2.0),
                          SeriesPoint(2, 3.0, 3.0, 3.0)]

    def test_contiguous_buckets_with_min_max_last(self) -> None:
        points, downsampled = downsample(list(range(10)), [float(i) for i in range(10)], 5)
        assert downsampled
        assert points == [SeriesPoint(0, 0.0, 1.0, 1.0), SeriesPoint(2, 2.0, 3.0, 3.0),
                          SeriesPoint(4, 4.0, 5.0, 5.0), SeriesPoint(6, 6.0, 7.0, 7.0),
                          SeriesPoint(8, 8.0, 9.0, 9.0)]

    def test_isolated_spike_survives(self) -> None:
        steps = list(range(100_000))
        values = [1.0] * 100_000
        values[31_337] = 1e30
        points, downsampled = downsample(steps, values, 200)
        assert downsampled and len(points) <= 200
        assert max(p.max for p in points) == 1e30
        spike = [p for p in points if p.max == 1e30]
        assert len(spike) == 1 and spike[0].step <= 31_337 < spike[0].step + 500
        assert spike[0].min == 1.0

    def test_inf_spike_survives_and_nan_does_not_poison_the_bucket(self) -> None:
        steps = list(range(8))
        values = [1.0, math.inf, 2.0, math.nan, 3.0, 4.0, -math.inf, 5.0]
        points, _ = downsample(steps, values, 4)
        assert [(p.step, p.min, p.max) for p in points] == [
            (0, 1.0, math.inf), (2, 2.0, 2.0), (4, 3.0, 4.0), (6, -math.inf, 5.0)]
        assert math.isnan(points[1].last)

    def test_all_nan_bucket_is_nan(self) -> None:
        points, _ = downsample([0, 1, 2, 3], [math.nan, math.nan, 1.0, 2.0], 2)
        assert math.isnan(points[0].min) and math.isnan(points[0].max)
        assert math.isnan(points[0].last)
        assert points[1] == SeriesPoint(2, 1.0, 2.0, 2.0)

    def test_gaps_leave_empty_buckets_out(self) -> None:
        points, _ = downsample([0, 1, 2, 1000, 1001], [1.0, 2.0, 3.0, 4.0, 5.0], 4)
        assert points == [SeriesPoint(0, 1.0, 3.0, 3.0), SeriesPoint(753, 4.0, 5.0, 5.0)]

    def test_bucket_count_never_exceeds_max_points(self) -> None:
        for n in (3, 7, 11, 1000):
            for max_points in (1, 2, 3, 5):
                points, _ = downsample(list(range(n)), [0.0] * n, max_points)
                assert len(points) <= max_points

    def test_repeated_steps_from_a_resumed_attempt(self) -> None:
        points, _ = downsample([0, 1, 1, 2], [1.0, 5.0, 0.5, 2.0], 2)
        assert points == [SeriesPoint(0, 0.5, 5.0, 0.5), SeriesPoint(2, 2.0, 2.0, 2.0)]

    def test_rejects_mismatched_lengths(self) -> None:
        with pytest.raises(ValueError, match="2 steps but 1 values"):
            downsample([0, 1], [1.0], 5)

    def test_rejects_zero_points(self) -> None:
        with pytest.raises(ValueError, match="max_points must be at least 1, got 0"):
            downsample([0], [1.0], 0)


class TestScaleEvents:
    def test_kinds(self) -> None:
        rows = [
            (0, False, 65536.0, 65536.0),
            (1, True, 65536.0, 32768.0),
            (2, False, 32768.0, 65536.0),
            (3, True, 1.0, 1.0),
            (4, False, None, None),
            (5, False, math.nan, 2.0),
            (6, False, 4.0, math.inf),
        ]
        assert scale_events(rows) == [
            ScaleEvent(1, "skipped", 65536.0, 32768.0),
            ScaleEvent(1, "backoff", 65536.0, 32768.0),
            ScaleEvent(2, "growth", 32768.0, 65536.0),
            ScaleEvent(3, "skipped", 1.0, 1.0),
            ScaleEvent(6, "growth", 4.0, math.inf),
        ]

    def test_empty(self) -> None:
        assert scale_events([]) == []


class TestDerivedStats:
    def test_lost_frac(self) -> None:
        assert lost_frac(0.25, 0.125) == 0.375

    def test_headroom_bits(self) -> None:
        fp16 = FORMATS["fp16"]
        assert headroom_bits(1.0, 1.0, fp16) == math.log2(65504.0)
        assert headroom_bits(2.0**-10, 2.0**16, fp16) == pytest.approx(math.log2(65504.0) - 6)
        assert headroom_bits(65504.0, 2.0, fp16) == -1.0

    def test_headroom_edges(self) -> None:
        fp16 = FORMATS["fp16"]
        assert headroom_bits(0.0, 65536.0, fp16) == math.inf
        assert headroom_bits(None, 65536.0, fp16) is None
        assert headroom_bits(1.0, None, fp16) == math.log2(65504.0)
        assert headroom_bits(1.0, math.inf, fp16) is None
        assert headroom_bits(1.0, math.nan, fp16) is None
        assert headroom_bits(1.0, 0.0, fp16) is None
