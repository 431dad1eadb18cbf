"""Resin's delta-rule kernels (`resin_models_cuda/kernels/delta_rule.py`) against
flash-linear-attention's (`fla-core`, the `dev` extra; issue 37), on the same inputs at a
preset's linear-attention shapes: Gated DeltaNet (`qwen3.5-35b-a3b`: 16 q/k heads shared by 32
value heads, K = V = 128) and KDA (`glm-5.3-flash`: 64 heads, K = V = 128, gates bounded below
by -5), each in its chunked form (prefill: `--prefill-batches` rows of each of
`--prefill-lengths` tokens) and its recurrent one (decode: `--decode-batches` rows of
`--decode-length` tokens).

What each side is given (one case's inputs, built once, outside the timing):
* ours: what the model passes, q | k | v in one [T, 2*HK*K + HV*V] buffer (the conv's
  output), the raw gate inputs (GDN: `a` with `A_log` and `dt_bias`; KDA: float32 log decays
  [T, H, K]), beta's logits, the float32 state pages [pages, HV, K, V] with `StateRows` (row
  i reads page i and writes page batch + i, so repeated calls do the same work); the chunk is
  the model's `prefill_chunk` (GDN 64, or 32 for float32 inputs as the model does; KDA 16)
  unless `--our-chunk`, its products at the kernel's precision for the dtype (TF32 for bf16,
  `chunk_precision`) unless `--precision`, its scan's value block the kernel's unless
  `--our-block-v`; a list in any of the three runs each chunked case once per combination.
* fla: its layout, q / k / v split into contiguous [1, T, H, D] tensors (the split is not
  timed: a model on fla would have its conv write them so), varlen rows by `cu_seqlens`, the
  same state [N, HV, K, V] (K-first, fla's default) as `initial_state` with
  `output_final_state=True`, and the same math inside: `use_qk_l2norm_in_kernel`,
  `use_beta_sigmoid_in_kernel`, scale K^-0.5; GDN's gate from the raw `a`
  (`use_gate_in_kernel` with `A_log`, `dt_bias`); KDA's log decays as given (with
  `safe_gate` and the preset's `lower_bound` where it has one, as GLM-5.3 does). Calls:
  `chunk_gated_delta_rule` / `fused_recurrent_gated_delta_rule` and `chunk_kda` /
  `fused_recurrent_kda`, chunk `--fla-chunk` (64, fla's default).

First the agreement: both from the same state, the max abs difference of the outputs and of
the final states (with the largest |value| of ours beside each; `agree` when both differences
are within `--tolerance` of it). Then the time: a call's microseconds, the median over
`--reps` of `--inner` back-to-back calls (CUDA: each rep a replay of a CUDA graph of the
`--inner` calls timed by CUDA events, both sides eager and event-timed where either cannot be
captured; `timing` says which; CPU: wall clock, for the plumbing only). `ratio` is ours / fla;
`decision` applies docs/benchmarks.md's rule to the row: keep ours where ratio <= 1.10, else
fla, if fla agreed; the verdict per path (kernel, mode) takes the geometric mean of its rows
(`decide`). `--kernels` (CUDA) adds our side's device time a call by kernel (the chunked
form's two phases apart), from torch's profiler. Prints a table and the verdicts, and
appends every row to `--output` as JSONL (a side that failed: its time null and its error
in `error`). `--before FILE` (the JSONL of an earlier run on the same machine, e.g. another
tree's kernels) then prints each row's time beside the same case there, after / before, with
fla's two times as the anchor (they should agree: else the machine changed between the runs),
and the geometric mean of after / before per path (`against`).

    resin bench delta-rule --output bench/delta_rule.jsonl

CPU smoke run (Triton's interpreter, `TRITON_INTERPRET=1`): `--device cpu --presets
tiny-qwen3_5_moe,tiny-glm5_next --prefill-batches 2 --prefill-lengths 20 --decode-batches 2
--reps 1 --inner 1`.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, replace
from functools import partial
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any, Literal

import torch
import torch.nn.functional as F

from resin_app.bench.report import write_jsonl
from resin_model.presets import preset
from resin_models_cuda.kernels.delta_rule import chunk_precision, gated_delta_rule, kda_delta_rule
from resin_models_cuda.models.glm5_next import KimiDeltaAttention
from resin_models_cuda.models.qwen3_5_moe import GatedDeltaNet
from resin_models_cuda.step import StateRows

DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}
KEEP_OURS_AT = 1.10  # ours / fla at or below: keep ours (docs/benchmarks.md)
PRECISIONS = ("ieee", "tf32x3", "tf32")
Mode = Literal["chunked", "recurrent"]
Outputs = tuple[torch.Tensor, torch.Tensor]  # o [T, HV, V], final states [batch, HV, K, V]


@dataclass(frozen=True)
class Shape:
    """A preset's linear-attention layer: `kernel` "gdn" (Qwen3.5) or "kda" (GLM-5.3)."""

    preset: str
    kernel: Literal["gdn", "kda"]
    qk_heads: int
    v_heads: int
    k_dim: int
    v_dim: int
    lower_bound: float | None  # KDA's gate bound (log space), None: softplus gates
    our_chunk: int  # the model's `prefill_chunk`


def shape_of(name: str) -> Shape:
    config = preset(name)
    lin = config.linear_attention
    if lin is None:
        raise ValueError(f"preset {name!r} has no linear-attention layers")
    glm = config.glm5_next
    kernel: Literal["gdn", "kda"] = "kda" if glm is not None else "gdn"
    lower = glm.gate_lower_bound if glm is not None else None
    chunk = KimiDeltaAttention.prefill_chunk if glm else GatedDeltaNet.prefill_chunk
    return Shape(name, kernel, lin.num_k_heads, lin.num_v_heads, lin.k_head_dim,
                 lin.v_head_dim, lower, chunk)  # fmt: skip


@dataclass(frozen=True)
class Inputs:
    """One case's tensors, in our layout and fla's (module docstring)."""

    mixed: torch.Tensor  # [T, 2*HK*K + HV*V]
    gate: torch.Tensor  # GDN: raw `a` [T, HV]; KDA: float32 log decays [T, HV, K]
    b: torch.Tensor  # beta's logits [T, HV]
    a_log: torch.Tensor  # float32 [HV] (GDN)
    dt_bias: torch.Tensor  # float32 [HV] (GDN)
    pages: torch.Tensor  # float32 [2 * batch, HV, K, V]: row i reads page i, writes batch + i
    rows: StateRows
    q: torch.Tensor  # fla's [1, T, HK, K], contiguous
    k: torch.Tensor
    v: torch.Tensor  # [1, T, HV, V]
    cu_seqlens: torch.Tensor  # int64 [batch + 1]
    cu_seqlens_cpu: torch.Tensor


def _rows(batch: int, length: int, region: torch.Tensor) -> StateRows:
    device = region.device

    def i32(values: Sequence[int]) -> torch.Tensor:
        return torch.tensor(list(values), dtype=torch.int32, device=device)

    indptr = [row * length for row in range(batch + 1)]
    token_row = [row for row in range(batch) for _ in range(length)]
    no_checkpoints = i32([0] * (batch + 1)), i32([0]), i32([0])
    return StateRows(region, i32(indptr), i32(token_row), i32(range(batch)),
                     i32(range(batch, 2 * batch)), *no_checkpoints)  # fmt: skip


def make_inputs(
    s: Shape, batch: int, length: int, device: torch.device, dtype: torch.dtype
) -> Inputs:
    """Random inputs of the layer's shapes. Decays mild enough that the state carries across
    chunks, so the agreement covers the carry: GDN's -A softplus(a + 1) with A ~ U(0.1, 1),
    a ~ N(0, 1) (log decays about -3 to -0.03 a token); KDA's `forget_gate` of a unit rate
    over inputs ~ N(-3, 1) (at its bound of -5: mostly -0.1 to -1 a channel)."""
    gen = torch.Generator().manual_seed(0)
    t, hk, hv, kd, vd = batch * length, s.qk_heads, s.v_heads, s.k_dim, s.v_dim

    def randn(*size: int) -> torch.Tensor:
        return torch.randn(*size, generator=gen)

    mixed = randn(t, 2 * hk * kd + hv * vd).to(device, dtype)
    if s.kernel == "gdn":
        gate = randn(t, hv).to(device, dtype)
    else:
        raw = randn(t, hv, kd) - 3.0
        lower = s.lower_bound
        gate = (lower * torch.sigmoid(raw) if lower is not None else -F.softplus(raw)).to(device)
    a_log = torch.empty(hv).uniform_(0.1, 1.0, generator=gen).log().to(device)
    dt_bias = torch.ones(hv, device=device)
    pages = (randn(2 * batch, hv, kd, vd) * 0.1).to(device)
    q, k, v = torch.split(mixed, [hk * kd, hk * kd, hv * vd], dim=1)
    cu = torch.arange(batch + 1, dtype=torch.int64) * length
    return Inputs(mixed, gate, randn(t, hv).to(device, dtype), a_log, dt_bias, pages,
                  _rows(batch, length, pages), q.reshape(1, t, hk, kd).contiguous(),
                  k.reshape(1, t, hk, kd).contiguous(), v.reshape(1, t, hv, vd).contiguous(),
                  cu.to(device), cu)  # fmt: skip


def ours(
    s: Shape, x: Inputs, mode: Mode, chunk: int, precision: str | None = None, block_v: int = 0
) -> Callable[[], Outputs]:
    """Our kernel on `x` (the chunked form's products at `precision`, its scan `block_v`
    value columns a program; None / 0: the kernel's defaults); returns its outputs and the
    states it wrote."""
    batch = x.rows.state_in.shape[0]
    chunk = chunk if mode == "chunked" else 0

    def call() -> Outputs:
        if s.kernel == "gdn":
            o = gated_delta_rule(x.mixed, x.gate, x.b, x.a_log, x.dt_bias, x.pages, x.rows,
                                 s.qk_heads, chunk=chunk, precision=precision,
                                 block_v=block_v)  # fmt: skip
        else:
            o = kda_delta_rule(x.mixed, x.gate, x.b, x.pages, x.rows, chunk=chunk,
                               precision=precision, block_v=block_v)  # fmt: skip
        return o, x.pages[batch:]

    return call


def fla_call(s: Shape, mode: Mode, chunk: int) -> tuple[str, Callable[[Inputs], Outputs]]:
    """fla's function for this kernel and mode, and how it is called (module docstring)."""
    from fla.ops.gated_delta_rule import chunk_gated_delta_rule, fused_recurrent_gated_delta_rule
    from fla.ops.kda import chunk_kda, fused_recurrent_kda

    common: dict[str, Any] = dict(
        scale=s.k_dim**-0.5, output_final_state=True, use_qk_l2norm_in_kernel=True,
        use_beta_sigmoid_in_kernel=True,
    )  # fmt: skip
    if mode == "chunked":
        common["chunk_size"] = chunk
    if s.kernel == "gdn":
        fn = chunk_gated_delta_rule if mode == "chunked" else fused_recurrent_gated_delta_rule
        name = f"{fn.__name__}(use_gate_in_kernel=True)"
    else:
        fn = chunk_kda if mode == "chunked" else fused_recurrent_kda
        if mode == "chunked" and s.lower_bound is not None:
            common.update(safe_gate=True, lower_bound=s.lower_bound)
        name = f"{fn.__name__}({'safe_gate=True' if 'safe_gate' in common else ''})"

    def call(x: Inputs) -> Outputs:
        batch = x.rows.state_in.shape[0]
        extra: dict[str, Any] = dict(cu_seqlens=x.cu_seqlens)
        if mode == "chunked":
            extra["cu_seqlens_cpu"] = x.cu_seqlens_cpu
        if s.kernel == "gdn":
            extra.update(use_gate_in_kernel=True, A_log=x.a_log, dt_bias=x.dt_bias)
        # by keyword: fused_recurrent_gated_delta_rule's third positional is `gk`, not beta
        o, state = fn(x.q, x.k, x.v, g=x.gate[None], beta=x.b[None],
                      initial_state=x.pages[:batch], **common, **extra)  # fmt: skip
        return o[0], state

    return name, call


@dataclass(frozen=True)
class Agreement:
    max_abs_out: float
    max_abs_state: float
    out_scale: float  # max |o| of ours
    state_scale: float  # max |state| of ours

    def within(self, tolerance: float) -> bool:
        return (
            self.max_abs_out <= tolerance * self.out_scale
            and self.max_abs_state <= tolerance * self.state_scale
        )


def agreement(mine: Outputs, theirs: Outputs) -> Agreement:
    (o, h), (o2, h2) = mine, theirs
    assert o.shape == o2.shape and h.shape == h2.shape, (o.shape, o2.shape, h.shape, h2.shape)
    return Agreement(
        (o.float() - o2.float()).abs().max().item(), (h.float() - h2.float()).abs().max().item(),
        o.float().abs().max().item(), h.float().abs().max().item(),
    )  # fmt: skip


def _repeat(fn: Callable[[], object], inner: int) -> Callable[[], None]:
    def run() -> None:
        for _ in range(inner):
            fn()

    return run


def _median_us(run: Callable[[], None], device: torch.device, reps: int, inner: int) -> float:
    """Microseconds a call: the median over `reps` of `run` (`inner` calls) timed by CUDA
    events (CPU: the wall clock)."""
    times = []
    for _ in range(reps):
        if device.type != "cuda":
            started = time.perf_counter()
            run()
            times.append((time.perf_counter() - started) * 1e6)
            continue
        start = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
        end = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
        start.record()
        run()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3)
    return statistics.median(times) / inner


def _capture(fn: Callable[[], object], inner: int) -> Callable[[], None]:
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        _repeat(fn, inner)()
    graph.replay()
    torch.cuda.synchronize()
    return graph.replay


def time_pair(
    calls: Sequence[Callable[[], object]], device: torch.device, reps: int, inner: int
) -> tuple[list[float], str]:
    """Each call's microseconds (`_median_us`), all timed the same way: CUDA graphs where
    every call captures, else eager; the calls have run (compiled, autotuned) before."""
    runs = [_repeat(fn, inner) for fn in calls]
    timing = "wall"
    if device.type == "cuda":
        timing = "graph"
        try:
            runs = [_capture(fn, inner) for fn in calls]
        except Exception as exc:  # a host sync inside a call, say
            print("  graph capture failed, timing eagerly:", type(exc).__name__, flush=True)
            torch.cuda.synchronize()
            timing = "eager"
    return [_median_us(run, device, reps, inner) for run in runs], timing


@dataclass(frozen=True)
class Row:
    kernel: str
    mode: str
    preset: str
    batch: int
    length: int  # tokens a row
    qk_heads: int
    v_heads: int
    k_dim: int
    v_dim: int
    dtype: str
    our_chunk: int  # 0: the recurrent kernel
    precision: str  # our chunked form's products (tl.dot's input_precision)
    block_v: int  # value columns a program of our chunked scan (0: the kernel's default)
    fla_call: str
    max_abs_out: float | None
    max_abs_state: float | None
    out_scale: float | None
    state_scale: float | None
    agree: bool
    ours_us: float | None
    fla_us: float | None
    timing: str
    error: str | None
    kernels_us: dict[str, float] | None = None  # --kernels: our device time a call, by kernel

    @property
    def ratio(self) -> float | None:
        return self.ours_us / self.fla_us if self.ours_us and self.fla_us else None

    @property
    def decision(self) -> str | None:
        """The rule on this row alone: fla only where it is faster past the margin and agrees."""
        ratio = self.ratio
        if ratio is None:
            return None
        return "fla" if ratio > KEEP_OURS_AT and self.agree else "ours"


@dataclass(frozen=True)
class Options:
    device: torch.device
    dtype: str
    our_chunk: int | None
    precision: str | None
    block_v: int
    fla_chunk: int
    reps: int
    inner: int
    tolerance: float
    kernels: bool = False


def kernel_times(fn: Callable[[], object], calls: int = 5) -> dict[str, float]:
    """Device microseconds a call of `fn` spends in each kernel, by the kernel's name (torch's
    profiler over `calls` calls, after one untimed)."""
    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
    totals: dict[str, float] = {}
    for event in prof.events():
        if event.device_type == torch.autograd.DeviceType.CUDA:
            totals[event.name] = totals.get(event.name, 0.0) + event.device_time_total / calls
    return totals


def _error(exc: Exception) -> str:
    return f"{type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}"


def bench_case(s: Shape, mode: Mode, batch: int, length: int, opt: Options) -> Row:
    chunk = s.our_chunk if opt.our_chunk is None else opt.our_chunk
    if opt.our_chunk is None and opt.dtype == "fp32":
        chunk = min(chunk, 32)  # as the model (GatedDeltaNet)
    x = make_inputs(s, batch, length, opt.device, DTYPES[opt.dtype])
    mine = ours(s, x, mode, chunk, opt.precision, opt.block_v)
    precision = opt.precision or chunk_precision(x.mixed.dtype)
    name, theirs_of = fla_call(s, mode, opt.fla_chunk)

    def theirs() -> Outputs:
        return theirs_of(x)

    row = partial(Row, s.kernel, mode, s.preset, batch, length, s.qk_heads, s.v_heads, s.k_dim,
                  s.v_dim, opt.dtype, chunk if mode == "chunked" else 0, precision, opt.block_v,
                  name)  # fmt: skip
    try:
        got = mine()
    except Exception as exc:  # out of memory, say
        return row(None, None, None, None, False, None, None, "-", f"ours: {_error(exc)}")
    try:
        diff = agreement(got, theirs())
    except Exception as exc:  # fla refuses the shape, or cannot run here
        (ours_us,), timing = time_pair([mine], opt.device, opt.reps, opt.inner)
        return row(None, None, None, None, False, ours_us, None, timing, _error(exc))
    theirs()  # fla autotunes on its first calls
    (ours_us, fla_us), timing = time_pair([mine, theirs], opt.device, opt.reps, opt.inner)
    kernels = kernel_times(mine) if opt.kernels and opt.device.type == "cuda" else None
    return row(diff.max_abs_out, diff.max_abs_state, diff.out_scale, diff.state_scale,
               diff.within(opt.tolerance), ours_us, fla_us, timing, None, kernels)  # fmt: skip


HEADER = (f"{'kernel':<7}{'mode':<10}{'batch':>6}{'len':>6}{'chunk':>6}{'prec':>7}{'|dO|':>10}"
          f"{'|dS|':>10}"
          f"{'ours us':>11}{'fla us':>11}{'ours/fla':>9}  decision")  # fmt: skip


def report(rows: Sequence[Row]) -> None:
    print(HEADER)
    for r in rows:
        print(line(r))


def line(r: Row) -> str:
    """One row of the table."""
    fla = f"{r.fla_us:>11.1f}" if r.fla_us else f"{'-':>11}"
    ratio = f"{r.ratio:>9.2f}" if r.ratio else f"{'-':>9}"
    do = f"{r.max_abs_out:>10.2e}" if r.max_abs_out is not None else f"{'-':>10}"
    ds = f"{r.max_abs_state:>10.2e}" if r.max_abs_state is not None else f"{'-':>10}"
    note = r.decision or r.error or ""
    note += "" if r.agree or r.error else "  (outputs disagree)"
    prec = r.precision if r.our_chunk else "-"
    return (f"{r.kernel:<7}{r.mode:<10}{r.batch:>6}{r.length:>6}{r.our_chunk:>6}{prec:>7}{do}{ds}"
            f"{r.ours_us or math.nan:>11.1f}{fla}{ratio}  {note}")  # fmt: skip


def decide(rows: Sequence[Row]) -> dict[tuple[str, str], str]:
    """Per path (kernel, mode): the geometric mean of its rows' ours / fla; "ours" at or
    below `KEEP_OURS_AT`, else "fla", unless fla failed or disagreed on a row of the path."""
    paths: dict[tuple[str, str], list[Row]] = {}
    for r in rows:
        paths.setdefault((r.kernel, r.mode), []).append(r)
    verdicts = {}
    for path, group in paths.items():
        ratios = [r.ratio for r in group if r.ratio]
        if len(ratios) < len(group) or not all(r.agree for r in group):
            verdicts[path] = "ours (fla failed or disagreed on a row)"
            continue
        mean = math.exp(statistics.fmean(math.log(x) for x in ratios))
        verdict = "ours" if mean <= KEEP_OURS_AT else "fla"
        verdicts[path] = f"{verdict} (ours/fla: geometric mean {mean:.2f}, max {max(ratios):.2f})"
    return verdicts


CASE_FIELDS = ("kernel", "mode", "preset", "batch", "length", "our_chunk", "precision", "block_v")


def against(rows: Sequence[Row], before: Sequence[dict[str, Any]]) -> list[str]:
    """Lines comparing `rows` with an earlier run's JSONL rows (`--before`): each case found in
    both, our time there and here and after / before (fla's beside it), then per path the
    geometric mean of after / before over its cases."""
    earlier = {tuple(b.get(f) for f in CASE_FIELDS): b for b in before}
    head = f"{'':<40}{'before':>11}{'after':>11}{'before':>8}{'before':>11}{'after':>11}"
    lines = [f"{'against --before':<40}{'ours us':>22}{'after/':>8}{'fla us':>22}", head]
    paths: dict[tuple[str, str], list[float]] = {}
    for r in rows:
        b = earlier.get(tuple(getattr(r, f) for f in CASE_FIELDS))
        if b is None or not b.get("ours_us") or not r.ours_us:
            continue
        ratio = r.ours_us / b["ours_us"]
        paths.setdefault((r.kernel, r.mode), []).append(ratio)
        chunk = f"chunk {r.our_chunk} {r.precision}" if r.our_chunk else ""
        case = f"{r.kernel} {r.mode} {r.batch}x{r.length} {chunk}"
        fla = [f"{x:>11.1f}" if x else f"{'-':>11}" for x in (b.get("fla_us"), r.fla_us)]
        lines.append(
            f"{case:<40}{b['ours_us']:>11.1f}{r.ours_us:>11.1f}{ratio:>8.2f}{''.join(fla)}"
        )
    for (kernel, mode), ratios in paths.items():
        mean = math.exp(statistics.fmean(math.log(x) for x in ratios))
        lines.append(f"{kernel} {mode}: after / before geometric mean {mean:.2f} "
                     f"over {len(ratios)} cases")  # fmt: skip
    return lines


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x]


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="resin bench delta-rule",
        description=__doc__,
        formatter_class=argparse.RawTextHelpFormatter,
    )
    p.add_argument("--presets", default="qwen3.5-35b-a3b,glm-5.3-flash",
                   help="presets with linear-attention layers (GDN or KDA)")  # fmt: skip
    p.add_argument("--modes", default="chunked,recurrent", help="chunked (prefill), recurrent")
    p.add_argument("--prefill-batches", default="1,8", help="rows of a chunked case")
    p.add_argument("--prefill-lengths", default="1024,4096", help="tokens a row, chunked")
    p.add_argument("--decode-batches", default="1,32,256", help="rows of a recurrent case")
    p.add_argument("--decode-length", type=int, default=1, help="tokens a row, recurrent")
    p.add_argument("--our-chunk", default="",
                   help="our chunks, comma-separated (default: the model's)")  # fmt: skip
    p.add_argument("--precision", default="",
                   help="our chunked form's matrix products (tl.dot's input_precision: ieee, "
                   "tf32x3, tf32), comma-separated: each chunked case once per precision, "
                   "chunk and block (default: the kernel's, by dtype)")  # fmt: skip
    p.add_argument("--our-block-v", default="",
                   help="value columns a program of our chunked scan, comma-separated "
                   "(default: the kernel's)")  # fmt: skip
    p.add_argument("--kernels", action="store_true",
                   help="CUDA: also our device time a call by kernel (torch's profiler), "
                   "printed under the row and in the JSONL's kernels_us")  # fmt: skip
    p.add_argument("--fla-chunk", type=int, default=64, help="fla's chunk_size")
    p.add_argument("--device", default="cuda")
    p.add_argument("--dtype", choices=sorted(DTYPES), default="bf16")
    p.add_argument("--reps", type=int, default=20)
    p.add_argument("--inner", type=int, default=10, help="back-to-back calls a timed rep")
    p.add_argument("--tolerance", type=float, default=5e-2,
                   help="agreement: max abs difference over max |ours|")  # fmt: skip
    p.add_argument("--output", type=Path, help="JSONL file (appended)")
    p.add_argument("--before", type=Path,
                   help="JSONL of an earlier run (same machine): each case beside it")  # fmt: skip
    return p


def cases(args: argparse.Namespace) -> list[tuple[Mode, int, int]]:
    out: list[tuple[Mode, int, int]] = []
    modes = args.modes.split(",")
    if "chunked" in modes:
        lengths = _ints(args.prefill_lengths)
        out += [("chunked", b, n) for b in _ints(args.prefill_batches) for n in lengths]
    if "recurrent" in modes:
        out += [("recurrent", b, args.decode_length) for b in _ints(args.decode_batches)]
    return out


def main(argv: Sequence[str] | None = None) -> int:
    p = parser()
    args = p.parse_args(argv)
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        p.error("no CUDA device (pass --device cpu with TRITON_INTERPRET=1 for a smoke run)")
    try:
        shapes = [shape_of(name) for name in args.presets.split(",")]
        fla_version = version("fla-core")
    except (ValueError, PackageNotFoundError) as exc:
        p.error(f"{exc} (fla-core: pip install fla-core, the dev extra)")
    precisions: list[str | None] = [*filter(None, args.precision.split(","))] or [None]
    if any(x not in (None, *PRECISIONS) for x in precisions):
        p.error(f"--precision takes {', '.join(PRECISIONS)}")
    opt = Options(device, args.dtype, None, None, 0, args.fla_chunk, args.reps, args.inner,
                  args.tolerance, args.kernels)  # fmt: skip
    chunks: list[int | None] = [*_ints(args.our_chunk)] or [None]
    variants = [replace(opt, our_chunk=c, precision=x, block_v=v)
                for c in chunks for x in precisions
                for v in _ints(args.our_block_v) or [0]]  # fmt: skip
    before: list[dict[str, Any]] = []
    if args.before:
        try:
            before = [json.loads(x) for x in args.before.read_text().splitlines() if x.strip()]
        except (OSError, ValueError) as exc:
            p.error(f"--before: {exc}")
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    rows: list[Row] = []
    with torch.no_grad():
        for s in shapes:
            for mode, batch, length in cases(args):
                print(f"{s.preset} {s.kernel} {mode} batch {batch} x {length}", flush=True)
                for variant in variants if mode == "chunked" else [opt]:
                    row = bench_case(s, mode, batch, length, variant)
                    rows.append(row)
                    print(line(row), flush=True)  # each row as it comes: a timeout keeps them
                    for kernel, us in (row.kernels_us or {}).items():
                        print(f"    {us:>10.1f} us  {kernel}", flush=True)
                    if args.output:
                        write_jsonl(args.output, [{**asdict(row), "ratio": row.ratio,
                                                   "decision": row.decision, "device": name,
                                                   "fla_version": fla_version}])  # fmt: skip
                    if device.type == "cuda":
                        torch.cuda.empty_cache()
    report(rows)
    for (kernel, path), verdict in decide(rows).items():
        print(f"{kernel} {path}: {verdict}")
    if args.before:
        print("\n".join(against(rows, before)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
