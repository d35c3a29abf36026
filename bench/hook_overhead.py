"""Hook overhead on the CPU reference loop: step time with / without ampscope, interleaved.

Prints, against a no-hook baseline measured in the same process run (DESIGN.md §8 budgets):

- ampscope at the default cadence (scalars every step, per-layer stats every 10th): ≤ 1.02x
- ampscope with per-layer stats every step: ≤ 1.10x
- the enqueue on the training thread (``Transport.put``), p50/p99: p99 ≤ 100 µs
- for scale, in the same run: a straightforward 9-pass ``torch._foreach_*`` version of the 8
  statistics (every step, one host copy), a per-tensor ``.item()`` loop, and, when importable,
  ``wandb.watch(model, log="gradients", log_freq=1)`` (offline, temp dir, nothing leaves the
  machine) and TensorBoard per-parameter gradient histograms (``add_histogram`` every step).

Method. Every configuration runs in *segments* of ``--steps`` timed steps (after ``--warmup``
untimed ones), interleaved with baseline segments: ``base X1 base X2 … base`` in every round, the
order of the X rotated from round to round. A configuration's ratio in a round is the median of its
segment over the median of the two baseline segments beside it, so slow drift of a shared, noisy
machine cancels; the report gives the median of the per-round ratios and their min-max. Records go
to ``MemorySender`` (no network, but the real sender thread, batching and encoding). The
``control`` configuration is a second no-hook model timed like the others: its ratio is the
bench's own floor (noise, and one model copy's memory placement against another's), so a hook
figure within the control's distance of 1.00 is not a measured cost.

Reading the median. At the default cadence one step in ten carries the per-layer statistics
(+0.8 ms here; the activation and histogram samples fall on those same steps) and the sender
thread's batch (every ``flush_interval``, 0.5 s by default) lands in about one step in 26: the
median step is a plain one, pushed a little up the tail by those (with ``flush_interval=0.2``,
one step in 11, the median ratio was ~0.5 % higher). The plain step's own cost (one
``_foreach_norm`` and a few small copies on the training thread) is most of the figure.

A configuration keeps ONE scaler and probe (one ``ampscope.watch``) across all its segments, so
its optimizer-step counter runs on from segment to segment and the sampled steps (activation
statistics every 50th step, exponent histograms every 100th, per-layer stats every 10th at the
default cadence) fall among the timed steps in their true proportion; a fresh monitor per segment
would put the step-0 samples in the untimed warm-up and never reach step 50.

Size sweep (#12): ``--sweep`` runs ``bench/hook_sweep.py`` instead (models of 0.25 M to 10 M
parameters, FP32 forward, the passes over gradient memory each configuration implies).

Reference model: the spec's "small transformer block plus an MLP" as ``Linear(32, d)``, four
pre-norm transformer blocks (``nn.MultiheadAttention`` + a 4x MLP, 12 parameter tensors each) and
``Linear(d, 10)``: 52 parameter tensors; fp16 autocast + ``GradScaler`` + AdamW. Default shape
d=64, batch 4 x 16 tokens (203k parameters), ~19 ms per step on this 2-core AMD EPYC (AVX2/F16C).

Why that shape. This CPU has no native fp16 arithmetic (no AVX512-FP16/AMX), so under fp16 autocast
every matmul runs a slow fallback GEMM: measured here, a ``Linear`` under fp16 autocast is 3-5x
slower than fp32 at 8-32 rows and 5-10x at 128-512 rows (~5-15 GMAC/s), where bf16 stays within
~1.2x of fp32. The previous shape (d=128, 16 x 32 = 512 tokens) took ~460 ms per step (fp32: 29 ms,
bf16: 29 ms), a step time made almost entirely of this fallback, which hid a hook costing ~1-2 ms
(ratio 1.002). The step time grows with tokens x d^2, so the fp16 step is brought to a realistic
small-model figure by keeping few tokens. Measured fp16-autocast step medians (fp32 / bf16 beside):

    d=128, 16x32 tokens  460 ms  (29 / 29)      d=128, 4x8 tokens   37 ms  (9.5 / 10)
    d=96,  4x16 tokens    34 ms  (8.9 / 12)     d=64,  8x16 tokens  32 ms  (8.1 / 9.6)
    d=64,  4x16 tokens    19 ms  (6.5 / 8.7)    <- default

The hook's cost depends on the parameter count (the reductions read every gradient) and on the
number of parameter tensors (Python and launch overhead), not on the token count; so the smallest
of these shapes is also the most demanding ratio for the hook. ``--d 128 --seq 8`` gives the 800k
parameter variant. Use ``--dtype bf16`` to see the same loop without the fp16 fallback.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import math
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

import ampscope
from ampscope.formats import TargetFormat
from ampscope.transport import MemorySender

FP16 = TargetFormat.get("fp16")
FP16_MIN_NORMAL, FP16_UNDERFLOW = FP16.min_normal, FP16.underflow_threshold


class Block(nn.Module):
    def __init__(self, d: int, heads: int) -> None:
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.attn = nn.MultiheadAttention(d, heads, batch_first=True)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        """``mask``: a causal attention mask (``gpu_check.py``'s GPT), None attends to all."""
        h = self.ln1(x)
        x = x + self.attn(h, h, h, attn_mask=mask, need_weights=False,
                          is_causal=mask is not None)[0]
        out: torch.Tensor = x + self.mlp(self.ln2(x))
        return out


def make_model(d: int = 64, blocks: int = 4, d_in: int = 32) -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Linear(d_in, d), *[Block(d, 4) for _ in range(blocks)], nn.Linear(d, 10)
    )


# -- configurations ------------------------------------------------------------------------------
class Probe:
    """What a configuration does around the usual step; the baseline does nothing."""

    def start_timing(self) -> None:
        """Called once the warm-up steps of a segment are done."""

    def after_backward(self, scaler: torch.amp.GradScaler) -> None:
        pass

    def after_step(self, loss: torch.Tensor, step: int) -> None:
        pass

    def close(self) -> None:
        pass


class AmpscopeProbe(Probe):
    def __init__(self, model: nn.Module, opt: torch.optim.Optimizer,
                 scaler: torch.amp.GradScaler, layer_every: int, enqueue_ns: list[int]) -> None:
        self.mon = ampscope.watch(model, scaler, opt, sender=MemorySender(),
                                  layer_every=layer_every)
        transport = self.mon._transport
        assert transport is not None
        put = transport.put
        self.timing = False

        def timed_put(item: Any) -> int:
            start = time.perf_counter_ns()
            backlog = put(item)
            if self.timing:
                enqueue_ns.append(time.perf_counter_ns() - start)
            return backlog

        transport.put = timed_put  # type: ignore[method-assign]

    def start_timing(self) -> None:
        self.timing = True

    def close(self) -> None:
        self.mon.close()


def foreach_9pass(grads: list[torch.Tensor], scale: torch.Tensor) -> torch.Tensor:
    """The 8 statistics the straightforward way: one ``_foreach``/per-tensor pass per statistic.

    Grads are captured scaled (before ``unscale_``), so the fp16 classes are judged on them as they
    are and the magnitudes are divided by the scale. One stacked result, one host copy.
    """
    a = torch._foreach_abs(grads)  # 1
    amax = torch.stack(torch._foreach_max(a))  # 2
    l2 = torch.stack(torch._foreach_norm(grads, 2))  # 3
    nonzero = torch.stack(torch._foreach_norm(grads, 0))  # 4
    nan = torch.stack([torch.isnan(g).sum() for g in grads]).double()  # 5
    inf = torch.stack([torch.isinf(g).sum() for g in grads]).double()  # 6
    lt_normal = torch.stack([(t < FP16_MIN_NORMAL).sum() for t in a]).double()  # 7
    lt_under = torch.stack([(t < FP16_UNDERFLOW).sum() for t in a]).double()  # 8
    amin = torch.stack([torch.where(t > 0, t, math.inf).amin() for t in a])  # 9
    numel = torch.tensor([g.numel() for g in grads], dtype=torch.float64)
    zero = numel - nonzero.double()
    inv = scale.double().reciprocal()
    stats = torch.stack([
        amax.double() * inv, amin.double() * inv, zero / numel, (lt_normal - zero) / numel,
        (lt_under - zero) / numel, nan, inf, l2.double() * inv,
    ])
    return stats.to("cpu", copy=True)


class Foreach9Probe(Probe):
    def __init__(self, model: nn.Module) -> None:
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.last: torch.Tensor | None = None

    def after_backward(self, scaler: torch.amp.GradScaler) -> None:
        grads = [p.grad for p in self.params if p.grad is not None]
        self.last = foreach_9pass(grads, scaler._scale)  # type: ignore[arg-type]


class ItemLoopProbe(Probe):
    """Per tensor, per statistic, a reduction and an ``.item()`` (what many debugging hooks do)."""

    def __init__(self, model: nn.Module) -> None:
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.last: list[list[float]] = []

    def after_backward(self, scaler: torch.amp.GradScaler) -> None:
        inv = 1.0 / scaler.get_scale()
        rows = []
        for p in self.params:
            g = p.grad
            if g is None:
                continue
            a = g.abs()
            n = g.numel()
            zero = (a == 0).sum().item()
            rows.append([
                a.max().item() * inv,
                a[a > 0].min().item() * inv if zero < n else math.nan,
                zero / n,
                ((a < FP16_MIN_NORMAL).sum().item() - zero) / n,
                ((a < FP16_UNDERFLOW).sum().item() - zero) / n,
                torch.isnan(g).sum().item(),
                torch.isinf(g).sum().item(),
                g.norm().item() * inv,
            ])
        self.last = rows


class TensorBoardProbe(Probe):
    def __init__(self, model: nn.Module, logdir: str) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(logdir)
        self.named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]

    def after_step(self, loss: torch.Tensor, step: int) -> None:
        for name, p in self.named:
            if p.grad is not None:
                self.writer.add_histogram(f"grad/{name}", p.grad, step)
        self.writer.add_scalar("loss", loss.item(), step)

    def close(self) -> None:
        self.writer.close()


class WandbProbe(Probe):
    """``wandb.watch(log="gradients", log_freq=1)``; ``wandb.log`` of the loss commits each step."""

    def __init__(self, model: nn.Module, run: Any) -> None:
        self.model, self.run = model, run
        run.watch(model, log="gradients", log_freq=1)

    def after_step(self, loss: torch.Tensor, step: int) -> None:
        self.run.log({"loss": loss.item()})

    def close(self) -> None:
        self.run.unwatch(self.model)


@dataclass
class Config:
    name: str
    label: str
    make: Callable[[nn.Module, torch.optim.Optimizer, torch.amp.GradScaler], Probe]
    enqueue_ns: list[int] = field(default_factory=list)


# -- timing --------------------------------------------------------------------------------------
class Live:
    """A configuration's model, optimizer, scaler and probe, made once and kept across its
    segments. Each configuration trains its own copy of the model (same seed, same weights): a
    monitor's wrappers and sampled hooks live on its model and optimizer, and must not run
    during the baseline's or another configuration's steps."""

    def __init__(self, args: argparse.Namespace,
                 make: Callable[[nn.Module, torch.optim.Optimizer, torch.amp.GradScaler], Probe]
                 | None) -> None:
        torch.manual_seed(0)
        self.model = make_model(args.d, args.blocks)
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=1e-3)
        self.scaler = torch.amp.GradScaler("cpu", init_scale=2.0**10)
        self.probe = make(self.model, self.opt, self.scaler) if make is not None else Probe()


def run_segment(live: Live, x: torch.Tensor, y: torch.Tensor, steps: int, warmup: int,
                dtype: torch.dtype) -> list[float]:
    """Timed step durations (s) of one segment; the warm-up steps are run and not counted."""
    model, opt, scaler, probe = live.model, live.opt, live.scaler, live.probe
    times: list[float] = []
    for i in range(warmup + steps):
        if i == warmup:
            probe.start_timing()
        start = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=dtype):
            out = model(x).float().mean(1)
        loss = nn.functional.cross_entropy(out, y)
        scaler.scale(loss).backward()
        probe.after_backward(scaler)
        scaler.step(opt)
        scaler.update()
        probe.after_step(loss.detach(), i)
        if i >= warmup:
            times.append(time.perf_counter() - start)
    return times


def pct(values: list[int], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * q))] / 1e3


@contextlib.contextmanager
def wandb_run(tmp: str) -> Iterator[Any]:
    """An offline wandb run in ``tmp``: no network, no console capture, no system-stats sampler."""
    for key, value in {"WANDB_MODE": "offline", "WANDB_SILENT": "true", "WANDB_DIR": tmp,
                       "WANDB_CACHE_DIR": tmp, "WANDB_CONFIG_DIR": tmp, "WANDB_DATA_DIR": tmp,
                       "WANDB_DISABLE_GIT": "true", "WANDB_DISABLE_CODE": "true",
                       "WANDB_ERROR_REPORTING": "false", "WANDB_CONSOLE": "off"}.items():
        os.environ[key] = value
    import wandb

    settings = wandb.Settings(mode="offline", console="off", x_disable_stats=True,
                              disable_git=True, save_code=False, silent=True)
    run = wandb.init(project="ampscope-bench", dir=tmp, settings=settings)
    try:
        yield run
    finally:
        run.finish()


def main() -> None:
    if "--sweep" in sys.argv:  # the size sweep of #12 (bench/hook_sweep.py), same options
        from hook_sweep import main as sweep_main  # type: ignore[import-not-found]

        sys.argv.remove("--sweep")
        sweep_main()
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=40, help="timed steps per segment")
    parser.add_argument("--rounds", type=int, default=10, help="interleaved rounds")
    parser.add_argument("--warmup", type=int, default=3, help="untimed steps per segment")
    parser.add_argument("--d", type=int, default=64, help="model width")
    parser.add_argument("--blocks", type=int, default=4, help="transformer blocks")
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--seq", type=int, default=16, help="tokens per sequence")
    parser.add_argument("--dtype", choices=("fp16", "bf16"), default="fp16", help="autocast dtype")
    parser.add_argument("--only", default="", help="comma-separated configuration names to run")
    parser.add_argument("--no-external", action="store_true", help="skip wandb and tensorboard")
    args = parser.parse_args()

    model = make_model(args.d, args.blocks)  # for the figures printed below
    torch.manual_seed(1)
    x = torch.randn(args.batch, args.seq, 32)
    y = torch.randint(0, 10, (args.batch,))
    dtype = torch.float16 if args.dtype == "fp16" else torch.bfloat16

    configs: list[Config] = []
    Make = Callable[[nn.Module, torch.optim.Optimizer, torch.amp.GradScaler], Probe]

    def hook(layer_every: int) -> Make:
        def make(model: nn.Module, opt: torch.optim.Optimizer,
                 scaler: torch.amp.GradScaler) -> Probe:
            cfg = next(c for c in configs if c.name == ("default" if layer_every == 10 else
                                                       "every"))
            return AmpscopeProbe(model, opt, scaler, layer_every, cfg.enqueue_ns)
        return make

    configs += [
        # A second no-hook model, timed as a configuration: the bench's own resolution (noise
        # and the memory placement of one model copy against another), printed beside the rest.
        Config("control", "no hook, a second model copy (the bench's floor)",
               lambda m, o, s: Probe()),
        Config("default", "ampscope, default cadence (layer_every=10)", hook(10)),
        Config("every", "ampscope, per-layer every step", hook(1)),
        Config("foreach9", "9-pass _foreach stats, every step",
               lambda m, o, s: Foreach9Probe(m)),
        Config("item", "per-tensor .item() loop, every step", lambda m, o, s: ItemLoopProbe(m)),
    ]
    missing: list[str] = []
    stack = contextlib.ExitStack()
    tmp = stack.enter_context(tempfile.TemporaryDirectory(prefix="ampscope-bench-"))
    if not args.no_external:
        if importlib.util.find_spec("tensorboard") is not None:
            configs.append(Config("tensorboard", "TensorBoard add_histogram per param, every step",
                                  lambda m, o, s: TensorBoardProbe(m, os.path.join(tmp, "tb"))))
        else:
            missing.append("tensorboard: not installed")
        if importlib.util.find_spec("wandb") is not None:
            state: dict[str, Any] = {}

            def make_wandb(model: nn.Module, opt: torch.optim.Optimizer,
                           scaler: torch.amp.GradScaler) -> Probe:
                if "run" not in state:
                    state["run"] = stack.enter_context(wandb_run(os.path.join(tmp, "wandb")))
                return WandbProbe(model, state["run"])

            configs.append(Config("wandb", "wandb.watch(log='gradients', log_freq=1), offline",
                                  make_wandb))
        else:
            missing.append("wandb: not installed")
    if args.only:
        wanted = set(args.only.split(","))
        configs = [c for c in configs if c.name in wanted]

    base_times: list[float] = []
    seg_times: dict[str, list[float]] = {c.name: [] for c in configs}
    ratios: dict[str, list[float]] = {c.name: [] for c in configs}
    started = time.perf_counter()
    with stack:
        # Every configuration made once and run untimed, so imports and first-call costs (and
        # the hook's first cycle, which learns the backward order) stay out of round 1.
        baseline = Live(args, None)
        lives = {c.name: Live(args, c.make) for c in configs}
        run_segment(baseline, x, y, 0, args.warmup, dtype)
        for c in configs:
            stack.callback(lives[c.name].probe.close)
            run_segment(lives[c.name], x, y, 0, args.warmup, dtype)
        for r in range(args.rounds):
            order = configs[r % len(configs):] + configs[: r % len(configs)]
            prev = run_segment(baseline, x, y, args.steps, args.warmup, dtype)
            base_times += prev
            for c in order:
                times = run_segment(lives[c.name], x, y, args.steps, args.warmup, dtype)
                nxt = run_segment(baseline, x, y, args.steps, args.warmup, dtype)
                base_times += nxt
                seg_times[c.name] += times
                ratios[c.name].append(statistics.median(times) / statistics.median(prev + nxt))
                prev = nxt
            print(f"  round {r + 1}/{args.rounds}: " + ", ".join(
                f"{c.name} {ratios[c.name][-1]:.3f}" for c in configs), file=sys.stderr,
                flush=True)
    elapsed = time.perf_counter() - started

    tensors = sum(1 for p in model.parameters() if p.requires_grad)
    params = sum(p.numel() for p in model.parameters())
    print(f"model: d={args.d}, {args.blocks} blocks, batch {args.batch} x {args.seq} tokens, "
          f"{args.dtype} autocast; {tensors} parameter tensors, {params} parameters; "
          f"torch {torch.__version__}, {torch.get_num_threads()} threads")
    print(f"{args.rounds} rounds x {args.steps} timed steps per segment ({args.warmup} warm-up "
          f"steps excluded), base/config segments interleaved; {elapsed:.0f} s")
    base = statistics.median(base_times)
    print(f"{'median step, no hook':<52} {base * 1e3:7.2f} ms")
    print(f"{'configuration':<52} {'median':>7}    ratio  (per-round median, min-max)")
    for c in configs:
        med = statistics.median(seg_times[c.name])
        rs = ratios[c.name]
        print(f"{c.label:<52} {med * 1e3:7.2f} ms {statistics.median(rs):6.3f}x "
              f"({min(rs):.3f}-{max(rs):.3f})")
    for line in missing:
        print(line)
    for c in configs:
        if c.enqueue_ns:
            print(f"enqueue ({c.name}): p50 {pct(c.enqueue_ns, 0.5):.1f} us, "
                  f"p99 {pct(c.enqueue_ns, 0.99):.1f} us, max {max(c.enqueue_ns) / 1e3:.1f} us "
                  f"over {len(c.enqueue_ns)} puts")
    print("budgets (DESIGN.md §8): default cadence <= 1.02x, per-layer every step <= 1.10x, "
          "enqueue p99 <= 100 us")


if __name__ == "__main__":
    main()
