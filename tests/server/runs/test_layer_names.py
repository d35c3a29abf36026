"""The server's copy of the canonical layer names (`ampscope_server.runs.layer_names`) gives
what the hook's (`ampscope.names`) gives, on the shared cases: the two sides cannot import each
other, and a drift would make the server match a run's layers by other names than the hook sent."""

from __future__ import annotations

import pytest

from ampscope import names as hook_names
from ampscope_server.runs import layer_names
from tests.support.layer_names import CASES, COLLIDING


@pytest.mark.parametrize(("raw", "expected"), CASES)
def test_canonical_name(raw: str, expected: str) -> None:
    assert layer_names.canonical_name(raw) == expected == hook_names.canonical_name(raw)


@pytest.mark.parametrize(("raws", "expected"), COLLIDING)
def test_canonical_names(raws: list[str], expected: list[str]) -> None:
    assert layer_names.canonical_names(raws) == expected == hook_names.canonical_names(raws)


def test_the_same_wrapper_components() -> None:
    assert layer_names.INNER_WRAPPERS == hook_names.INNER_WRAPPERS
    assert layer_names.LEADING_WRAPPERS == hook_names.LEADING_WRAPPERS
