from __future__ import annotations

import pytest
import torch
from torch import nn

from ampscope.order import BackwardOrder


def three_branches() -> tuple[nn.ModuleList, list[nn.Parameter]]:
    """Three independent linears (weights only): each one's gradient is accumulated when its own
    branch's backward reaches it, so the loss decides the order."""
    torch.manual_seed(0)
    layers = nn.ModuleList(nn.Linear(2, 2, bias=False) for _ in range(3))
    return layers, list(layers.parameters())


def backward(layers: nn.ModuleList, chain: list[int]) -> None:
    """A backward in which layer ``chain[0]`` is reached first, then ``chain[1]``, … (each
    later layer's output feeds the earlier one's input)."""
    x = torch.ones(1, 2)
    for i in reversed(chain):
        x = layers[i](x)
    x.sum().backward()


def test_before_any_backward_the_order_is_reverse_model_order() -> None:
    _, params = three_branches()
    order = BackwardOrder(params)
    assert order.learning
    assert order.order() == [2, 1, 0]


def test_learns_the_order_of_the_first_backward_then_stops_listening() -> None:
    layers, params = three_branches()
    order = BackwardOrder(params)
    backward(layers, [1, 0, 2])
    assert order.order() == [1, 0, 2]  # still learning: what was seen so far
    order.end_cycle()
    assert not order.learning
    for p in params:
        p.grad = None
    backward(layers, [2, 1, 0])  # a later backward in another order changes nothing
    assert order.order() == [1, 0, 2]


def test_layers_without_a_gradient_follow_in_reverse_model_order() -> None:
    layers, params = three_branches()
    order = BackwardOrder(params)
    backward(layers, [1])
    order.end_cycle()
    assert order.order() == [1, 2, 0]


def test_a_cycle_without_backward_keeps_listening() -> None:
    layers, params = three_branches()
    order = BackwardOrder(params)
    order.end_cycle()  # e.g. an update() with no backward before it
    assert order.learning
    backward(layers, [0, 2, 1])
    order.end_cycle()
    assert not order.learning
    assert order.order() == [0, 2, 1]


def test_remove_gives_up_learning_and_keeps_what_was_seen() -> None:
    layers, params = three_branches()
    order = BackwardOrder(params)
    backward(layers, [0])
    order.remove()
    assert not order.learning
    assert order.order() == [0, 2, 1]


def test_a_gradient_accumulated_twice_counts_once() -> None:
    layers, params = three_branches()
    order = BackwardOrder(params)
    backward(layers, [2, 0])
    backward(layers, [0, 2, 1])  # gradient accumulation: a second backward in the same cycle
    order.end_cycle()
    assert order.order() == [2, 0, 1]


def test_without_the_hook_api_the_order_is_reverse_model_order(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    layers, params = three_branches()
    monkeypatch.delattr(torch.Tensor, "register_post_accumulate_grad_hook")
    order = BackwardOrder(params)
    assert not order.learning
    backward(layers, [0, 1, 2])
    order.end_cycle()
    assert order.order() == [2, 1, 0]
