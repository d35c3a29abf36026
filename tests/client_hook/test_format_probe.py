"""The formats probe in a real FP16 AMP loop on the CPU: what the records carry, and that it is
``recipes.measure`` of the operands the step really had."""

from __future__ import annotations

import copy
import json
import pickle
from typing import Any

import pytest
import torch
from torch import nn

import ampscope
from ampscope.recipes import MOMENTS, OPERANDS, RECIPES, SCALE_WIDTH, STATS, measure, sample
from ampscope.transport import MemorySender
from tests.client_hook.amp_loop import AmpLoop


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv1d(4, 8, 3), nn.Flatten(), nn.Linear(8 * 14, 32), nn.ReLU(),
                         nn.Linear(32, 4))


def _floats(tagged: list[float | str]) -> list[float]:
    """A ``formats`` array as ``MemorySender.payloads`` gives it (unpacked, NaN tagged)."""
    return [float(v) for v in tagged]


def _batch(i: int) -> torch.Tensor:
    return torch.randn(16, 4, 16, generator=torch.Generator().manual_seed(i))


class _Operands:
    """Our own hooks on the GEMM modules, keeping what the probe should have measured."""

    def __init__(self, model: nn.Module) -> None:
        self.seen: dict[tuple[int, str], torch.Tensor] = {}
        self.modules = [m for m in model.modules() if isinstance(m, nn.Linear | nn.Conv1d)]
        for k, m in enumerate(self.modules):
            m.register_forward_hook(self._forward(k))

    def _forward(self, k: int) -> Any:
        def hook(module: nn.Module, inputs: tuple[torch.Tensor, ...], out: torch.Tensor) -> None:
            self.seen[k, "input"] = inputs[0].detach().clone()
            weight = module.weight
            assert isinstance(weight, torch.Tensor)
            self.seen[k, "weight"] = weight.detach().clone()

            def grad(g: torch.Tensor) -> None:
                self.seen[k, "grad_output"] = g.detach().clone()
            out.register_hook(grad)
        return hook


def test_every_nth_step_carries_each_modules_operands_under_each_recipe() -> None:
    model = _model()
    ours = _Operands(model)
    loop = AmpLoop(model, formats_every=3)
    expected: dict[int, torch.Tensor] = {}
    for i in range(7):
        ours.seen.clear()
        scale = loop.scaler.get_scale()
        loop.step(_batch(i), closure=False)
        if i % 3 == 0:
            rows = []
            for k, m in enumerate(ours.modules):
                conv = isinstance(m, nn.Conv1d)
                for operand in OPERANDS:
                    one = sample(ours.seen[k, operand], operand, channels_first=conv)
                    row = measure([one], tuple(RECIPES.values()), operand)[0]
                    if operand == "grad_output":  # its amax and RMS in true units
                        at = len(RECIPES) * len(STATS)
                        row[at : at + 2] /= scale
                    rows.append(row)
            expected[i] = torch.stack(rows)
    raw = [r for body in loop.sink.bodies for r in json.loads(body)["records"]]
    records = loop.records()
    assert [r["step"] for r in records if "formats" in r] == [0, 3, 6]
    packed = [r["formats"] for r in raw if "formats" in r]
    assert all(set(f["values"]) == set(f["operands"]) == set(f["scales"]) == {"f64le"}
               for f in packed)
    width = len(RECIPES) * len(STATS)
    scales = len(RECIPES) * SCALE_WIDTH
    for record in records:
        block = record.get("formats")
        if block is None:
            continue
        assert block["recipes"] == list(RECIPES)
        # The rows of the Conv1d's and the Linears' weights in the layer table.
        assert block["layers"] == [0, 2, 4]
        values = torch.tensor(_floats(block["values"]), dtype=torch.float64)
        moments = torch.tensor(_floats(block["operands"]), dtype=torch.float64)
        exponents = torch.tensor(_floats(block["scales"]), dtype=torch.float64)
        want = expected[record["step"]]
        assert values.numel() == 3 * len(OPERANDS) * width
        assert moments.numel() == 3 * len(OPERANDS) * len(MOMENTS)
        assert exponents.numel() == 3 * len(OPERANDS) * scales
        assert torch.equal(values.view(-1, width), want[:, :width])
        assert torch.equal(moments.view(-1, len(MOMENTS)).nan_to_num(-1.0),
                           want[:, width : width + len(MOMENTS)].nan_to_num(-1.0))
        assert torch.equal(exponents.view(-1, scales).nan_to_num(-1.0),
                           want[:, width + len(MOMENTS):].nan_to_num(-1.0))


class TwoHeads(nn.Module):
    """A second head whose output is not in the loss: it gets no gradient."""

    def __init__(self) -> None:
        super().__init__()
        self.body, self.used, self.unused = nn.Linear(8, 8), nn.Linear(8, 2), nn.Linear(8, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.body(x)
        self.unused(h)
        out: torch.Tensor = self.used(h)
        return out


def test_a_module_without_a_gradient_reads_nan_and_no_hook_stays() -> None:
    """The unused head's grad_output row is NaN, its input and weight are measured; between
    samples no hook of ours is left, and the model pickles and deep-copies mid-sample."""
    model = TwoHeads()
    loop = AmpLoop(model, formats_every=2, formats=["mxfp8", "nvfp4"])
    loop.step(torch.randn(4, 8), closure=False)
    probe = loop.mon._cycle.formats
    assert probe is not None and not probe.armed and not probe._hook.registered
    loop.step(torch.randn(4, 8), closure=False)  # step 1: not a sample
    assert probe.armed and probe._hook.registered  # for step 2, by step 1's update()
    pickle.dumps(model)
    copy.deepcopy(model)
    block = next(r["formats"] for r in loop.records() if "formats" in r)
    assert block["recipes"] == ["mxfp8", "nvfp4"]
    values = torch.tensor(_floats(block["values"])).view(3, len(OPERANDS), 2, len(STATS))
    assert torch.isnan(values[2, 2]).all()  # unused: no gradient flowed
    assert not torch.isnan(values[2, :2]).any() and not torch.isnan(values[:2]).any()


def test_off_and_unknown() -> None:
    for options in ({"formats_every": 0}, {"formats": ()}):
        loop = AmpLoop(_model(), **options)
        loop.step(_batch(0), closure=False)
        assert loop.mon._cycle.formats is None
        assert all("formats" not in r for r in loop.records())
    with pytest.raises(ValueError, match=r"unknown formats \['fp6'\]; known: fp8_tensorwise, "):
        AmpLoop(_model(), formats=["mxfp8", "fp6"])


def test_a_failure_in_the_probe_never_reaches_training(monkeypatch: pytest.MonkeyPatch) -> None:
    import ampscope.format_probe as format_probe

    def broken(*args: object, **kwargs: object) -> torch.Tensor:
        raise RuntimeError("boom")
    monkeypatch.setattr(format_probe, "sample", broken)
    loop = AmpLoop(_model(), formats_every=1, max_errors=100)
    for i in range(3):
        loop.step(_batch(i), closure=False)
    records = loop.records()
    assert len(records) == 3 and all("formats" not in r for r in records)
    assert loop.mon.stats().internal_errors >= 3


@pytest.mark.parametrize(("recipe", "name"), [("tensorwise", "fp8_tensorwise"),
                                            ("rowwise", "fp8_rowwise")])
def test_a_float8_training_records_the_scales_its_modules_used(
        monkeypatch: pytest.MonkeyPatch, recipe: str, name: str) -> None:
    """torchao's Float8Linear (emulated on the CPU) trains in fp8_tensorwise or its row-wise
    recipe: the record keeps, per module and operand, the amax and the scale torchao computed on
    that step, equal (row-wise: the largest row's, the least of the per-row scales)."""
    import dataclasses
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import torchao.float8.float8_linear as float8_linear
        from torchao.float8 import Float8LinearConfig, convert_to_float8_training

    seen: dict[tuple[str, tuple[int, ...]], tuple[float, float]] = {}
    cast = float8_linear.hp_tensor_to_float8_dynamic

    def recording(hp: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        out = cast(hp, *args, **kwargs)
        key = (kwargs["gemm_input_role"].value, tuple(hp.shape))
        seen.setdefault(key, (hp.abs().amax().item(), out._scale.min().item()))
        return out
    monkeypatch.setattr(float8_linear, "hp_tensor_to_float8_dynamic", recording)

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 32), nn.Tanh(),
                          nn.Linear(32, 4))
    config = dataclasses.replace(Float8LinearConfig.from_recipe_name(recipe), emulate=True)
    convert_to_float8_training(model, config=config,
                               module_filter_fn=lambda m, name: name != "4")
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-2)
    sink = MemorySender()
    mon = ampscope.watch(model, None, optimizer, server=None, sender=sink, formats_every=2)
    for i in range(3):
        seen.clear()
        model(torch.randn(16, 64, generator=torch.Generator().manual_seed(i))).square().mean(
            ).backward()
        optimizer.step()
        optimizer.zero_grad()
    mon.close()
    block = [r["formats"] for b in sink.payloads() for r in b["records"] if "formats" in r][-1]
    trained = block["trained"]
    assert trained["recipes"] == [name, name, None]
    amax = torch.tensor(_floats(trained["amax"])).view(3, len(OPERANDS))
    scale = torch.tensor(_floats(trained["scale"])).view(3, len(OPERANDS))
    shapes = {  # the tensors torchao casts: the input, the weight transposed, the gradient
        0: {"input": (16, 64), "weight": (64, 128), "grad_output": (16, 128)},
        1: {"input": (16, 128), "weight": (128, 32), "grad_output": (16, 32)}}
    for k, operands in shapes.items():
        for o, operand in enumerate(OPERANDS):
            role = "grad_output" if operand == "grad_output" else operand
            assert (amax[k, o].item(), scale[k, o].item()) == seen[role, operands[operand]]
    assert torch.isnan(amax[2]).all() and torch.isnan(scale[2]).all()  # a plain Linear


class _Encoder(nn.Module):
    """A self-attention block: nn.MultiheadAttention runs in_proj_weight and out_proj inside
    its own forward, never calling out_proj."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.block = nn.TransformerEncoderLayer(16, 2, 32, dropout=0.0, batch_first=True)
        self.head = nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.head(self.block(x))
        return out


def test_multihead_attention_measures_what_its_forward_shows() -> None:
    """The packed in-projection: its input (the query, which is key and value too) and its
    weight; the out-projection: its weight and its output's gradient (the attention's output's,
    amax and RMS in true units); the operands inside the attention's forward are NaN."""
    model = _Encoder()
    attention = model.block.self_attn
    seen: dict[str, torch.Tensor] = {}

    def hook(module: nn.Module, inputs: tuple[torch.Tensor, ...], output: Any) -> None:
        seen["query"] = inputs[0].detach().clone()
        seen["in_proj"] = attention.in_proj_weight.detach().clone()
        seen["out_proj"] = attention.out_proj.weight.detach().clone()
        output[0].register_hook(lambda g: seen.__setitem__("grad", g.detach().clone()))
    attention.register_forward_hook(hook)
    loop = AmpLoop(model, formats_every=1)
    scale = loop.scaler.get_scale()
    loop.step(torch.randn(4, 6, 16, generator=torch.Generator().manual_seed(1)), closure=False)
    block = loop.records()[0]["formats"]
    table = [layer["name"] for layer in json.loads(loop.sink.bodies[0])["layers"]]
    assert [table[i] for i in block["layers"]] == [
        "block.self_attn.in_proj_weight", "block.self_attn.out_proj.weight",
        "block.linear1.weight", "block.linear2.weight", "block.norm1.weight",
        "block.norm2.weight", "head.weight"]
    every = tuple(RECIPES.values())
    width = len(RECIPES) * len(STATS)

    def measured(x: torch.Tensor, operand: str) -> torch.Tensor:
        row = measure([sample(x, operand)], every, operand)[0]  # type: ignore[arg-type]
        if operand == "grad_output":
            row[width : width + 2] /= scale
        return row

    nan = torch.full((width + len(MOMENTS) + len(RECIPES) * SCALE_WIDTH,), float("nan"),
                     dtype=torch.float64)
    expected = torch.stack([measured(seen["query"], "input"), measured(seen["in_proj"], "weight"),
                            nan, nan, measured(seen["out_proj"], "weight"),
                            measured(seen["grad"], "grad_output")])
    values = torch.tensor(_floats(block["values"]), dtype=torch.float64).view(7, 3, width)
    moments = torch.tensor(_floats(block["operands"]), dtype=torch.float64).view(7, 3, -1)
    scales = torch.tensor(_floats(block["scales"]), dtype=torch.float64).view(7, 3, -1)
    got = torch.cat([values, moments, scales], dim=2)[:2].reshape(6, -1)
    assert torch.equal(got.nan_to_num(-1.0), expected.nan_to_num(-1.0))
    # The feed-forward Linears and the head are measured whole, as any Linear; the norms'
    # affine weights as weights alone.
    assert not torch.isnan(values[[2, 3, 6]]).any()
    assert not torch.isnan(values[4:6, 1]).any() and torch.isnan(values[4:6, ::2]).all()


class _CrossAttention(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.attention = nn.MultiheadAttention(16, 2, batch_first=True)
        self.memory = nn.Linear(16, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        memory = self.memory(x)
        out: torch.Tensor = self.attention(x, memory, memory, need_weights=False)[0]
        return out


def test_cross_attention_leaves_the_in_projections_input_unmeasured() -> None:
    """Query and key/value differ: the packed in-projection projects three inputs, none of
    them its input, so that operand is NaN; its weight and the out-projection are measured."""
    loop = AmpLoop(_CrossAttention(), formats_every=1)
    loop.step(torch.randn(4, 6, 16, generator=torch.Generator().manual_seed(2)), closure=False)
    block = loop.records()[0]["formats"]
    table = [layer["name"] for layer in json.loads(loop.sink.bodies[0])["layers"]]
    assert [table[i] for i in block["layers"]] == [
        "attention.in_proj_weight", "attention.out_proj.weight", "memory.weight"]
    values = torch.tensor(_floats(block["values"]), dtype=torch.float64).view(3, 3, -1)
    measured = [[not torch.isnan(values[layer, operand]).any().item() for operand in range(3)]
                for layer in range(3)]
    assert measured == [[False, True, False], [False, True, True], [True, True, True]]


class _SeparateProjections(nn.Module):
    """Key and value narrower than the embedding: three separate in-projection weights."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.attention = nn.MultiheadAttention(16, 2, kdim=8, vdim=12, batch_first=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        key, value = x[..., :8] * 2, x[..., 4:] - 1
        out: torch.Tensor = self.attention(x, key, value, need_weights=False)[0]
        return out


def test_separate_in_projections_each_measure_their_input_and_weight() -> None:
    """``q_proj_weight``, ``k_proj_weight`` and ``v_proj_weight``: a row each, their inputs the
    query, the key and the value, equal to ``measure`` of what the attention was given; their
    output gradients are internal (NaN); the out-projection as under self-attention."""
    model = _SeparateProjections()
    attention = model.attention
    seen: dict[str, torch.Tensor] = {}

    def hook(module: nn.Module, inputs: tuple[torch.Tensor, ...], output: Any) -> None:
        for name, x in zip(("query", "key", "value"), inputs[:3], strict=True):
            seen[name] = x.detach().clone()
        for name in ("q_proj_weight", "k_proj_weight", "v_proj_weight"):
            seen[name] = getattr(attention, name).detach().clone()
    attention.register_forward_hook(hook)
    loop = AmpLoop(model, formats_every=1)
    loop.step(torch.randn(4, 6, 16, generator=torch.Generator().manual_seed(3)), closure=False)
    block = loop.records()[0]["formats"]
    table = [layer["name"] for layer in json.loads(loop.sink.bodies[0])["layers"]]
    assert [table[i] for i in block["layers"]] == [
        "attention.q_proj_weight", "attention.k_proj_weight", "attention.v_proj_weight",
        "attention.out_proj.weight"]
    every = tuple(RECIPES.values())
    width = len(RECIPES) * len(STATS)
    values = torch.tensor(_floats(block["values"]), dtype=torch.float64).view(4, 3, width)
    for row, (given, weight) in enumerate((("query", "q_proj_weight"), ("key", "k_proj_weight"),
                                           ("value", "v_proj_weight"))):
        assert torch.equal(values[row, 0], measure([sample(seen[given], "input")], every,
                                                   "input")[0, :width])
        assert torch.equal(values[row, 1], measure([sample(seen[weight], "weight")], every,
                                                   "weight")[0, :width])
        assert torch.isnan(values[row, 2]).all()
    assert torch.isnan(values[3, 0]).all() and not torch.isnan(values[3, 1:]).any()


class T5LayerNorm(nn.Module):
    """A norm by name only (Hugging Face's kind): it subclasses no torch norm."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(width))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.weight * x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)


class _Norms(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.up = nn.Linear(8, 40)
        self.ln = nn.LayerNorm(40)
        self.rms = nn.RMSNorm(40)
        self.t5 = T5LayerNorm(40)
        self.bare = nn.LayerNorm(40, elementwise_affine=False)
        self.down = nn.Linear(40, 2)
        with torch.no_grad():  # gains spread over 2^-12..2^3: FP4 flushes the small ones
            self.ln.weight.copy_(torch.logspace(-12, 3, 40, base=2.0))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # float(): RMSNorm warns of a half input against its float weight under autocast.
        out: torch.Tensor = self.down(self.bare(self.t5(self.rms(self.ln(self.up(x)).float()))))
        return out


def test_a_norms_affine_weight_is_a_weight_row_of_its_own() -> None:
    """LayerNorm, RMSNorm and a norm by name: a row each, the weight measured as one row of
    blocks along its length (``measure`` of a ``(1, 40)`` matrix), input and output gradient
    NaN; a norm without an affine weight has no row."""
    model = _Norms()
    loop = AmpLoop(model, formats_every=1)
    before = {norm: norm.weight.detach().clone() for norm in (model.ln, model.rms, model.t5)}
    loop.step(torch.randn(4, 8, generator=torch.Generator().manual_seed(4)), closure=False)
    block = loop.records()[0]["formats"]
    table = [layer["name"] for layer in json.loads(loop.sink.bodies[0])["layers"]]
    assert [table[i] for i in block["layers"]] == [
        "up.weight", "ln.weight", "rms.weight", "t5.weight", "down.weight"]
    every = tuple(RECIPES.values())
    width = len(RECIPES) * len(STATS)
    values = torch.tensor(_floats(block["values"]), dtype=torch.float64).view(5, 3, width)
    for row, norm in ((1, model.ln), (2, model.rms), (3, model.t5)):
        one = sample(before[norm], "weight")
        assert (one.rows, one.cols) == (1, 40)
        assert torch.equal(values[row, 1], measure([one], every, "weight")[0, :width])
        assert torch.isnan(values[row, 0]).all() and torch.isnan(values[row, 2]).all()
    stats = values[1, 1].view(len(RECIPES), len(STATS))
    flushed = {name: stats[r, STATS.index("underflow_frac")].item()
               for r, name in enumerate(RECIPES)}
    # 2^-12..2^3 in one row: E4M3 (17 binades with its subnormals) keeps every gain, E2M1's
    # 4 binades flush the small ones, MX's 32-blocks and NVFP4's 16-blocks alike.
    assert [name for name, f in flushed.items() if f > 0] == ["mxfp4", "nvfp4"]
