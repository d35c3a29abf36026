"""``ampscope.zero`` without a job: a plain model is no engine. The engines themselves, real
ones in 1- and 2-process jobs, are in ``integrations/test_deepspeed.py``."""

from __future__ import annotations

from torch import nn

from ampscope import zero


class TestEngineOf:
    def test_a_plain_module_is_no_engine(self) -> None:
        model = nn.Linear(2, 2)
        assert (zero.engine_of(model), zero.is_engine(model), zero.partitioned(model)) == (
            None, False, False)
