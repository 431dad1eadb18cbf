"""`CudaRunner`: any fast model (`resin_models_cuda.models`) on Triton kernels and CUDA graphs.

Implements the Runner protocol (`runner_config`, `bind`, `forward`, `close`) and the
AsyncRunner one (`submit`, `collect`) with `RunnerConfig.overlap`: `submit` only enqueues
device work and returns, so the engine can plan step n+1 while step n runs; at most two
plans are in flight and `collect` returns their outputs in order. The tokens a step samples
stay on the device (`_prev_tokens`), so the next plan's `prev_token_rows` are resolved there,
inside its decode graph.

A step: copy-on-write page copies first; decode plans (one query token per row, or 1 + k for
rows verifying k drafts) and short prefills (a few rows of up to `graph_prefill_tokens`
tokens: a prefix hit's suffix) go into the persistent buffers with one pinned host-to-device
copy and replay the graph of their padded shape, which computes logits and their argmax;
other plans run eagerly through the varlen prefill kernels. Sampling runs on the device
(`sampling.py`), for a plan whose mask is pending at the next `submit` or its `collect`;
the step's only sync is the wait for its token read-back, in `collect`.

MTP drafts (`RunnerOptions.mtp`, DeepSeek): right after a step's tokens are chosen, on the
device and with no host round trip, the model's MTP layer runs over the step's positions:
the entry at position i pairs the final hidden state at i with token i+1 (the next input,
or for the last position of a row the token just chosen), written at position i's append
slot of its cache layer, and the chosen tokens' entries give one greedy draft per row, read
back with the tokens into `ForwardOutput.draft_ids` (`MtpProposer`). This is the reference
`MtpRunner`'s pairing (token i with the hidden state at i-1, at position i) shifted one
position back, which rotary attention cannot tell apart, so that every entry a draft needs is
one the step has an append slot for. The entry at the last position of a prefill chunk that samples
nothing pairs with a stand-in token (the next chunk's first token is not in the plan); like
an entry under a prefix hit, it can make a draft worse, never an output different.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path

import numpy as np
import torch

from resin.plan import BatchPlan, ForwardOutput, Phase
from resin.protocols import CacheLayout, RunnerConfig
from resin_model.checkpoint_names import names_for
from resin_model.config import ModelConfig
from resin_model.hf_config import load_config
from resin_model.media_cache import MediaFeatures, StepMedia
from resin_model.presets import checkpoint_bytes
from resin_model.quant_checkpoint import QuantFormat, quantization_config
from resin_model.quant_config import parse_quant_config
from resin_models_cuda.architectures import build_model
from resin_models_cuda.buffers import DecodeBuffers
from resin_models_cuda.graphs import (
    CapturedDrafts,
    CapturedStep,
    buckets_up_to,
    capture,
    capture_drafts,
    pick_bucket,
    query_buckets,
)
from resin_models_cuda.kernels import decode_splits
from resin_models_cuda.kernels.pdl import set_pdl
from resin_models_cuda.kernels.sampler import argmax_rows
from resin_models_cuda.layers import RandomWeights, SafetensorsWeights, WeightSource
from resin_models_cuda.layers.quantized import (
    QuantizingWeights,
    StoredWeights,
    needs_stored_weights,
)
from resin_models_cuda.models import BuildOptions, FastModel
from resin_models_cuda.options import RunnerOptions
from resin_models_cuda.prompt_logprobs import PromptLogprobs, prompt_logprobs, prompt_tokens
from resin_models_cuda.runner_setup import check_plan, copy_pages, make_runner_config, prefill_step
from resin_models_cuda.sampling import (
    DeviceSampler,
    Picked,
    ReadBack,
    plain_output,
    speculative_output,
)
from resin_models_cuda.step import DecodeInfo, StateRows, StepTensors

__all__ = ["CudaRunner", "RunnerOptions", "load_model", "load_runner", "random_runner"]

log = logging.getLogger("resin.cuda")

MAX_IN_FLIGHT = 2
PREV_ROWS = 4096  # rows of the previous plan whose tokens stay on the device (at least)
MAX_REMEMBERED = 4096  # sequences whose latest MTP draft is kept


def random_runner(
    config: ModelConfig,
    options: RunnerOptions | None = None,
    device: str = "cuda",
    dtype: torch.dtype = torch.bfloat16,
    seed: int = 0,
    quantize: QuantFormat | None = None,
) -> CudaRunner:
    """A runner on random weights of the config's real shapes (benchmarks); `quantize`: its
    projections and experts quantized on the device as they are made (`QuantizingWeights`)."""
    options = options or RunnerOptions()
    source: WeightSource = RandomWeights(device, dtype, seed=seed, num_layers=config.num_layers)
    if quantize is not None:
        source = QuantizingWeights(source, quantize)
        config = replace(config, quant=parse_quant_config(quantization_config(quantize)))
    start = time.perf_counter()
    model = build_model(config, source, options.build_options())
    log.info(
        "random weights: %.2f GB on %s, %.2f GB as stored, in %.1f s",
        model.nbytes() / 1e9,
        device,
        checkpoint_bytes(config, dtype.itemsize) / 1e9,
        time.perf_counter() - start,
    )
    return CudaRunner(model, options)


def load_runner(
    folder: str | Path,
    options: RunnerOptions | None = None,
    device: str | torch.device = "cuda",
    dtype: torch.dtype = torch.bfloat16,
) -> CudaRunner:
    """A runner for a Hugging Face checkpoint folder (config.json + safetensors)."""
    options = options or RunnerOptions()
    return CudaRunner(load_model(folder, options, device, dtype), options)


def load_model(
    folder: str | Path,
    options: RunnerOptions,
    device: str | torch.device = "cuda",
    dtype: torch.dtype = torch.bfloat16,
    build: BuildOptions | None = None,
) -> FastModel:
    """The fast model of a checkpoint folder, its weights cast to `dtype` on `device` (a bar
    over the checkpoint's bytes on a terminal; a log line with the weights' size and time);
    quantized checkpoints (and float32 routers) are read as stored (`StoredWeights`).
    `build`: instead of `options.build_options()`."""
    start = time.perf_counter()
    config = load_config(folder)
    source: WeightSource
    names = names_for(config.model_type)
    if needs_stored_weights(config):  # quantized weights, or float32 routers read exactly
        source = StoredWeights(str(folder), config.quant, device, dtype, names)
    else:
        source = SafetensorsWeights(str(folder), device, dtype, names=names)
    try:
        model = build_model(config, source, build or options.build_options())
    finally:
        if isinstance(source, SafetensorsWeights):
            source.close()
    read = source.loaded_bytes if isinstance(source, SafetensorsWeights) else source.stored_bytes
    log.info(
        "weights: %.2f GB stored, %.2f GB as %s on %s, in %.1f s",
        read / 1e9,
        model.nbytes() / 1e9,
        str(dtype).removeprefix("torch."),
        device,
        time.perf_counter() - start,
    )
    return model


@dataclass(frozen=True, slots=True)
class _InFlight:
    plan: BatchPlan
    rows: np.ndarray  # plan row of each sampled entry, in order
    offsets: np.ndarray | None  # query offset j of each entry (verify steps), else None
    picked: Picked
    prompt: PromptLogprobs | None = None  # plans with prompt-logprob rows
    drafts: torch.Tensor | None = None  # MTP: one draft per sampled entry (read back after)


@dataclass(frozen=True, slots=True)
class _MtpInputs:
    """What the MTP layer reads after a step: its final hidden states, the flat query index of
    each sampled entry, and either the varlen step's tensors with the MTP input ids before the
    chosen tokens go in (`base_ids`), or the decode buffers' `shape` (those are built only if
    the pass runs eagerly) and the MTP graph captured after that shape's decode graph."""

    hidden: torch.Tensor
    flat: torch.Tensor
    step: StepTensors | None = None
    base_ids: torch.Tensor | None = None
    shape: tuple[int, int] = (0, 0)
    graph: CapturedDrafts | None = None


class CudaRunner:
    def __init__(self, model: FastModel, options: RunnerOptions | None = None) -> None:
        self.model = model
        self.config = model.config
        self.options = options or RunnerOptions()
        self.device, self.dtype = model.device, model.dtype
        self._graphs_enabled = self.options.cuda_graphs and self.device.type == "cuda"
        self._graphs_enabled = self._graphs_enabled and not model.eager_only
        self._max_positions = min(self.options.max_context, self.config.max_positions) + 1
        self._num_sms = (
            torch.cuda.get_device_properties(self.device).multi_processor_count
            if self.device.type == "cuda"
            else 1  # the CPU interpreter pays per program: no split-KV there
        )
        self._runner_config = make_runner_config(model, self.options)
        self._sampler = DeviceSampler(self.device, self.options.seed)
        # Programmatic dependent launch (`kernels/pdl.py`): process-wide, read at each launch,
        # so the graphs `bind` captures keep what is set here.
        self.pdl = set_pdl(self.options.pdl, self.device)
        if self.options.pdl and not self.pdl:
            log.warning("PDL needs a CUDA device of sm_90 or later (not the interpreter): off")
        # Query tokens a row of the fixed-shape decode path may carry: 1 + the drafts the
        # cache groups can drop (none where a State group cannot rewind: linear attention's;
        # DeepSeek-V4's compressor rings keep room for them, `State.rewind`).
        self._max_query = 1 + self._runner_config.max_draft_tokens
        self.kv: torch.Tensor | None = None
        self.state: torch.Tensor | None = None  # the State region [pages, page bytes] (uint8)
        rows = self.options.max_batch
        self._state_index = torch.arange(rows + 1, dtype=torch.int32, device=self.device)
        self._state_zeros = torch.zeros(rows + 1, dtype=torch.int32, device=self.device)
        self._buffers: DecodeBuffers | None = None
        self._graphs: dict[tuple[int, int], CapturedStep] = {}
        self._replay = True  # False inside `eager_decode`
        self._draft_graphs: dict[tuple[int, int], CapturedDrafts] = {}
        self._buckets: tuple[int, ...] = ()
        self._verify_buckets: tuple[int, ...] = ()
        self._queries: tuple[int, ...] = ()
        self._inflight: deque[_InFlight | partial[_InFlight] | Exception] = deque()
        self._prev_tokens = torch.zeros(
            max(PREV_ROWS, self.options.max_batch), dtype=torch.int32, device=self.device
        )
        self._prev_valid = 0  # rows of the previous plan whose token is in _prev_tokens
        self._readback = ReadBack(max(PREV_ROWS, self.options.max_batch), self.device)
        self.last_logits: torch.Tensor | None = None
        # MTP drafts travel in ForwardOutput.draft_ids; this is the runner's own record:
        # seq_id -> (num_tokens, drafts that follow a sequence that long)
        self.drafts: dict[int, tuple[int, list[int]]] = {}
        # MTP drafts every step (a model built with its MTP layer); benchmarks switch it off
        # for their plain runs
        self.mtp_enabled = getattr(model, "mtp", None) is not None
        if self.options.mtp and not self.mtp_enabled:
            raise ValueError(
                f"{self.config.model_type}: MTP drafts need a DeepSeek model built with its "
                "MTP layer (RunnerOptions.mtp)"
            )
        # Short prefills through the fixed-shape body (`RunnerOptions.graph_prefill_tokens`),
        # not with MTP drafts: their pass covers every position of a prefill
        short = model.graph_prefill and not model.eager_only and not self.mtp_enabled
        self._prefill_query = self.options.graph_prefill_tokens if short else 0
        self._prefill_rows = self.options.graph_prefill_rows if short else 0
        self._prefill_buckets: tuple[int, ...] = ()
        self._prefill_queries: tuple[int, ...] = ()
        self.accept_first: int | None = None  # bench only (`resin bench speculative`)
        self.media = MediaFeatures(model)  # image features by content hash (vision models)

    # ----- Runner protocol -------------------------------------------------------------------

    @property
    def runner_config(self) -> RunnerConfig:
        return self._runner_config

    @property
    def captured_batches(self) -> tuple[int, ...]:
        """The decode batch sizes `bind` captured in CUDA graphs (none before, or eager)."""
        return tuple(b for b in self._buckets if (b, 1) in self._graphs)

    @contextmanager
    def eager_decode(self) -> Iterator[None]:
        """Inside, decode steps run their captured graphs' bodies eagerly: the same padded
        shapes and kernels, each launched from the host (a profiler that links kernels to the
        ops that launched them needs the launches; `resin bench runner --kernels`)."""
        self._replay = False
        try:
            yield
        finally:
            self._replay = True

    def bind(self, layout: CacheLayout) -> None:
        """Allocate the KV arena for `layout.num_pages` pages and capture the decode graphs."""
        if self.kv is not None:
            raise RuntimeError("bind() was already called")
        ours = self._runner_config.page_bytes
        if layout.page_size != self.options.page_size or layout.page_bytes < ours:
            raise ValueError(f"layout {layout} does not fit this runner's pages ({ours} bytes)")
        if layout.num_pages * layout.page_size >= 2**31:
            raise ValueError("arena too large for int32 slots")
        planes, heads, dim = self.model.cache_token_shape()
        # Page p holds page_size tokens of every layer of the group that owns it; groups with
        # fewer layers use the first slots.
        shape = (layout.num_pages, max(self.model.layers_per_group), planes, layout.page_size)
        self.kv = torch.zeros((*shape, heads, dim), dtype=self.dtype, device=self.device)
        if self._runner_config.state_page_bytes:
            if layout.state_page_bytes < self._runner_config.state_page_bytes:
                raise ValueError(f"layout {layout} has State pages smaller than a checkpoint")
            size = (layout.state_pages, layout.state_page_bytes)
            self.state = torch.zeros(size, dtype=torch.uint8, device=self.device)
        pages_per_seq = -(-self.options.max_context // layout.page_size) + 1
        declared = self._runner_config.cache_groups
        groups = sum(not g.state_region for g in declared)  # token groups, then State ones
        rows = self.options.max_batch
        self._buffers = DecodeBuffers(
            rows, groups * rows * pages_per_seq, self.device, groups,
            max(self._max_query, self._prefill_query), num_states=len(declared) - groups,
            split_states=self.model.split_states,
        )  # fmt: skip
        if self._graphs_enabled:
            self._buckets = buckets_up_to(rows)
            # With MTP drafts every decode step verifies: graphs for every batch size.
            verify_rows = rows if self.mtp_enabled else self.options.verify_graph_batch
            self._verify_buckets = buckets_up_to(min(rows, verify_rows))
            self._queries = query_buckets(self._max_query)
            shapes = [(b, 1) for b in self._buckets]
            shapes += [(b, q) for b in self._verify_buckets for q in self._queries]
            if self._prefill_rows:
                self._prefill_buckets = buckets_up_to(min(rows, self._prefill_rows))
                self._prefill_queries = query_buckets(self._prefill_query)
            prefill = [(b, q) for b in self._prefill_buckets for q in self._prefill_queries]
            prefill = [s for s in prefill if s not in shapes]
            stage = self._buffers.stage_padding
            self._graphs = capture(shapes + prefill, self._decode_body, stage)
            if self.mtp_enabled:
                self._draft_graphs = capture_drafts(shapes, self._drafts_body, stage)

    def forward(self, plan: BatchPlan) -> ForwardOutput:
        if self._inflight:
            raise RuntimeError("forward() while submitted plans are uncollected")
        self.submit(plan)
        return self.collect()

    def submit(self, plan: BatchPlan) -> None:
        """Enqueue `plan` on the device and return (at most two plans in flight)."""
        if self.kv is None or self._buffers is None:
            raise RuntimeError("submit() before bind()")
        self._sample_deferred()
        if len(self._inflight) >= MAX_IN_FLIGHT:
            raise RuntimeError(f"{MAX_IN_FLIGHT} plans are in flight: collect() first")
        check_plan(plan, self.options, self._max_positions, self._prev_valid)
        self._inflight.append(self._launch(plan))

    def collect(self) -> ForwardOutput:
        """The output of the oldest uncollected plan (waits for its tokens)."""
        if not self._inflight:
            raise RuntimeError("collect() without a submitted plan")
        if isinstance(self._inflight[0], partial):
            self._sample_deferred()
        step = self._inflight.popleft()
        if not isinstance(step, _InFlight):  # its deferred sampling failed
            raise step if isinstance(step, Exception) else RuntimeError("unsampled step")
        tokens = step.picked.wait()
        lps = step.picked.host_logprobs()
        if step.offsets is None:
            out = plain_output(step.plan, step.rows, tokens, lps)
        else:
            out = speculative_output(
                step.plan, step.rows, step.offsets, tokens, lps, self.accept_first
            )
        if step.drafts is not None:
            out = self._remember_drafts(step, out)
        return out if step.prompt is None else step.prompt.attach(out)

    def close(self) -> None:
        self._inflight.clear()
        self._graphs.clear()
        self.kv = self.state = None
        self._buffers = None

    # ----- internals -------------------------------------------------------------------------

    def _sample_deferred(self) -> None:
        """Sample the newest plan if its sampling waited for its mask (waits for it now)."""
        pick = self._inflight[-1] if self._inflight else None
        if not isinstance(pick, partial):
            return
        self._inflight.pop()
        try:
            self._inflight.append(pick())
        except Exception as exc:  # reported by its collect; nothing may chain on it
            self._prev_valid = 0
            self._inflight.append(exc)

    def _launch(self, plan: BatchPlan) -> _InFlight | partial[_InFlight]:
        assert self.kv is not None and self._buffers is not None
        media = self.media.gather(plan)  # refuses media without an encoder
        copy_pages(plan, self.kv, self.state)
        b = plan.num_sequences
        qlens = plan.query_lens
        query = int(qlens.max(initial=1))
        offsets: np.ndarray | None = None
        argmax: torch.Tensor | None = None
        mtp: _MtpInputs | None = None
        asks_prompt = bool(plan.prompt_logprob_rows.any())  # a decode row's target is unknown
        buffered = plan.phase is Phase.DECODE and b <= self._buffers.max_rows and media is None
        buffered = buffered and not self.model.eager_only
        buffered = buffered and not (asks_prompt and prompt_tokens(plan).size)  # needs hidden
        buffered = buffered and not any(g.checkpoint_token.size for g in plan.cache_groups)
        short = self._short_prefill(plan, query, media, asks_prompt)
        if short is not None:  # a short prefill in the fixed-shape body: sampled rows' last
            self._buffers.stage(plan, *short)
            logits, found, _ = self._fixed_body(short)
            rows = np.flatnonzero(plan.sample_rows)
            last = rows * short[1] + qlens[rows].astype(np.int64) - 1
            at = torch.from_numpy(last).to(self.device)
            logits, argmax, prompt = logits[at], found[at], None
        elif buffered and query <= self._max_query:
            prompt = prompt_logprobs(plan, None, self.model.logits, 0) if asks_prompt else None
            shape = self._pick_graph(b, query) or (b, query)
            self._buffers.stage(plan, *shape)
            logits, argmax, hidden = self._fixed_body(shape)
            rows = np.arange(b)
            if query == 1:
                logits, argmax = logits[:b], argmax[:b]
                index = torch.arange(b, device=self.device) if self.mtp_enabled else None
            else:  # every query token of a row samples (verify)
                rows = np.repeat(rows, qlens)
                offsets = np.arange(plan.num_tokens) - np.repeat(plan.query_indptr[:-1], qlens)
                index = torch.from_numpy(rows * shape[1] + offsets).to(self.device)
                logits, argmax = logits[index], argmax[index]
            if index is not None and self.mtp_enabled:
                graph = self._draft_graphs.get(shape)
                mtp = _MtpInputs(hidden, index, shape=shape, graph=graph)
        else:  # varlen kernels (prefill, or decode beyond the buffers: verify rows causal too)
            rows, offsets, logits, prompt, mtp = self._eager(plan, media)
        if self.options.keep_logits:
            self.last_logits = logits.clone()
        if plan.sampling.mask_pending is not None:
            return partial(self._pick, plan, rows, offsets, logits, argmax, prompt, mtp)
        return self._pick(plan, rows, offsets, logits, argmax, prompt, mtp)

    def _fixed_body(self, shape: tuple[int, int]) -> tuple[torch.Tensor, ...]:
        """Logits, argmax and hidden states of the staged buffers: the graph of `shape`
        replayed when captured, else its body run eagerly."""
        if self._replay and shape in self._graphs:
            captured = self._graphs[shape]
            captured.graph.replay()
            return captured.logits, captured.argmax, captured.hidden
        return self._decode_body(*shape)

    def _short_prefill(
        self, plan: BatchPlan, query: int, media: StepMedia | None, asks_prompt: bool
    ) -> tuple[int, int] | None:
        """The fixed shape (rows, query slots) a short prefill step (`query` tokens in its
        longest row) runs in, or None: varlen (`RunnerOptions.graph_prefill_tokens`). One
        token a row takes the decode graphs, unless a State checkpoint needs the split State
        rows of two slots or more."""
        if plan.phase is not Phase.PREFILL or not self._prefill_query or asks_prompt:
            return None
        assert self._buffers is not None
        b = plan.num_sequences
        if query > self._prefill_query or media is not None or b > self._buffers.max_rows:
            return None
        if plan.prev_token_rows.size and int(plan.prev_token_rows.max()) >= 0:
            return None  # (decode plans only take their input from the previous step)
        if any(g.checkpoint_token.size for g in plan.cache_groups):
            if not self._buffers.split_states:
                return None
            query = max(query, 2)
        if query == 1:
            return self._pick_graph(b, 1) or (b, 1)
        if b > self._prefill_rows:
            return None
        row_bucket = pick_bucket(b, self._prefill_buckets)
        q = pick_bucket(query, self._prefill_queries)
        return (b, query) if row_bucket is None or q is None else (row_bucket, q)

    def _eager(self, plan: BatchPlan, media: StepMedia | None) -> tuple[
        np.ndarray, np.ndarray | None, torch.Tensor, PromptLogprobs | None, _MtpInputs | None
    ]:  # fmt: skip
        """A varlen step: the plan row and query offset (verify rows) of each logits row, the
        logits, the prompt logprobs the plan asks for, and the MTP layer's inputs."""
        assert self.kv is not None
        step_tensors = prefill_step(
            plan, self.options, self.config, self.dtype, self.device, media, self.state
        )
        hidden = self.model.forward(self._with_prev(plan, step_tensors), self.kv)
        prompt = None
        if plan.prompt_logprob_rows.any():
            prompt = prompt_logprobs(plan, hidden, self.model.logits, self.config.vocab_size)
        offsets: np.ndarray | None = None
        if plan.draft_ids.size:  # every query token samples
            qlens = plan.query_lens
            rows = np.repeat(np.arange(plan.num_sequences), qlens)
            offsets = np.arange(plan.num_tokens) - np.repeat(plan.query_indptr[:-1], qlens)
            logits = self.model.logits(hidden)
            flat = np.arange(plan.num_tokens)
        else:
            rows = np.flatnonzero(plan.sample_rows)
            flat = plan.last_token_index[rows].astype(np.int64)
            logits = self.model.logits(hidden[torch.from_numpy(flat).to(self.device)])
        mtp = None
        if self.mtp_enabled:
            # Token t+1 of the row is the next input; a row's last slot gets the token chosen
            # there (filled in after sampling) or, in a chunk that samples nothing, a stand-in.
            ids = plan.input_ids.astype(np.int32)
            base = np.concatenate((ids[1:], ids[-1:]))
            last = plan.query_indptr[1:].astype(np.int64) - 1
            base[last] = ids[last]
            index = torch.from_numpy(flat.astype(np.int64)).to(self.device)
            base_ids = torch.from_numpy(base).to(self.device)
            mtp = _MtpInputs(hidden, index, step_tensors, base_ids)
        return rows, offsets, logits, prompt, mtp

    def _pick(
        self,
        plan: BatchPlan,
        rows: np.ndarray,
        offsets: np.ndarray | None,
        logits: torch.Tensor,
        argmax: torch.Tensor | None,
        prompt: PromptLogprobs | None = None,
        mtp: _MtpInputs | None = None,
    ) -> _InFlight:
        tokens, lps = self._sampler.pick(plan, rows, offsets, logits, argmax)
        self._keep_tokens(plan, rows, offsets, tokens, body_kept=tokens is argmax)
        drafts = None
        if mtp is not None:
            greedy = argmax is not None and tokens is argmax  # the graph's own tokens
            if greedy and mtp.graph is not None:
                mtp.graph.graph.replay()
                drafts = mtp.graph.drafts[mtp.flat]
            else:
                drafts = self._mtp_drafts(mtp, tokens)
        host, event = self._readback.send(tokens if drafts is None else torch.cat((tokens, drafts)))
        asked = plan.sampling.logprobs[rows] if lps is not None else None
        picked = Picked(tokens, host, event, lps, asked)
        return _InFlight(plan, rows, offsets, picked, prompt, drafts)

    def _mtp_drafts(self, mtp: _MtpInputs, tokens: torch.Tensor) -> torch.Tensor:
        """One greedy MTP draft per sampled entry (see the module docstring); the MTP layer
        also writes its cache layer at the step's append slots."""
        assert self.kv is not None
        step, base = mtp.step, mtp.base_ids
        if step is None or base is None:  # a decode step: its buffers, slots past it padding
            step = self._decode_step(*mtp.shape)
            base = torch.zeros(mtp.shape[0] * mtp.shape[1], dtype=torch.int32, device=self.device)
        ids = base  # this step's own tensor: the chosen tokens go in place
        ids[mtp.flat] = tokens.to(ids.dtype)
        model = self.model
        out = model.mtp_forward(ids, mtp.hidden, step, self.kv)  # type: ignore[attr-defined]
        if not mtp.flat.numel():  # a prefill chunk that samples nothing: entries only
            return tokens.new_empty(0)
        return argmax_rows(model.logits(out[mtp.flat]))

    def _remember_drafts(self, step: _InFlight, out: ForwardOutput) -> ForwardOutput:
        """`out` with each row's draft (`ForwardOutput.draft_ids`): the one at its last kept
        entry, following the sequence as it stands after this step (`num_tokens`)."""
        assert step.drafts is not None
        host = step.picked.host
        n = step.rows.shape[0]
        drafts = host[n : 2 * n].numpy()
        plan = step.plan
        kept = np.diff(out.token_indptr.astype(np.int64))
        k = np.diff(plan.draft_indptr.astype(np.int64)) if plan.draft_ids.size else 0
        lengths = plan.total_lens.astype(np.int64) - k + kept
        first = np.searchsorted(step.rows, np.arange(plan.num_sequences))  # rows are in order
        rows = np.flatnonzero(kept > 0)
        ids = drafts[first[rows] + kept[rows] - 1].astype(np.int32)
        for row, draft in zip(rows.tolist(), ids.tolist(), strict=True):
            self.drafts[int(plan.sequence_ids[row])] = (int(lengths[row]), [draft])
        for sid in list(self.drafts)[: max(len(self.drafts) - MAX_REMEMBERED, 0)]:
            del self.drafts[sid]  # forget the sequences seen longest ago
        indptr = np.zeros(plan.num_sequences + 1, dtype=np.int32)
        np.cumsum(kept > 0, out=indptr[1:])
        return replace(out, draft_ids=ids, draft_indptr=indptr)

    def _pick_graph(self, b: int, query: int) -> tuple[int, int] | None:
        if not self._graphs:
            return None
        if query == 1:
            bucket = pick_bucket(b, self._buckets)
            return None if bucket is None else (bucket, 1)
        bucket = pick_bucket(b, self._verify_buckets)
        q = pick_bucket(query, self._queries)
        return None if bucket is None or q is None else (bucket, q)

    def _keep_tokens(
        self,
        plan: BatchPlan,
        rows: np.ndarray,
        offsets: np.ndarray | None,
        tokens: torch.Tensor,
        body_kept: bool,
    ) -> None:
        """Leave each row's sampled token in `_prev_tokens` for the next plan's prev rows
        (a greedy decode step's graph did it already: `body_kept`)."""
        if offsets is not None or plan.num_sequences > self._prev_tokens.shape[0]:
            self._prev_valid = 0  # verify steps: the engine drains the pipeline after them
            return
        if plan.phase is Phase.DECODE and rows.shape[0] == plan.num_sequences:
            if not body_kept:
                self._prev_tokens[: rows.shape[0]].copy_(tokens)
        elif rows.shape[0]:
            index = torch.from_numpy(rows.astype(np.int64)).to(self.device)
            self._prev_tokens.index_copy_(0, index, tokens)
        self._prev_valid = plan.num_sequences

    def _resolve_prev(self, ids: torch.Tensor, prev_rows: torch.Tensor) -> torch.Tensor:
        """Input ids with each `prev_rows[i] >= 0` replaced by that row's previous token."""
        gathered = self._prev_tokens[prev_rows.clamp(min=0).long()]
        return torch.where(prev_rows >= 0, gathered, ids)

    def _decode_step(self, rows: int, query: int) -> StepTensors:
        """The step tensors of the persistent buffers' first `rows` rows."""
        assert self._buffers is not None
        v = self._buffers.views(rows, query)
        ids = self._resolve_prev(v.input_ids, v.prev_rows) if query == 1 else v.input_ids
        splits = decode_splits(rows, self.config.num_kv_heads, self._num_sms)
        info = DecodeInfo(v.seq_lens, splits, query, v.q_lens if query > 1 else None)
        states: tuple[StateRows, ...] = ()
        if self.state is not None and v.split is not None:  # several slots a row: split rows
            sp = v.split
            checkpoints = zip(sp.ckpt_indptr, sp.ckpt_len, sp.ckpt_page, strict=True)
            states = tuple(
                StateRows(self.state, sp.indptr, sp.token_row, s_in, s_out, *ckpt)
                for s_in, s_out, ckpt in zip(v.state_in, v.state_out, checkpoints, strict=True)
            )
        elif self.state is not None:  # one token a row: row b's token is token b
            index, zeros = self._state_index, self._state_zeros
            indptr, row, none = index[: rows + 1], index[:rows], zeros[:1]
            states = tuple(
                StateRows(self.state, indptr, row, s_in, s_out, zeros[: rows + 1], none, none)
                for s_in, s_out in zip(v.state_in, v.state_out, strict=True)
            )
        state = states[0] if states else None
        return StepTensors(ids, v.positions, v.groups, info, state=state, states=states)

    def _drafts_body(self, rows: int, query: int) -> torch.Tensor:
        """The MTP pass after the decode graph of shape (rows, query) (graph body): a greedy
        step's token at every query slot is its argmax, so the MTP input there is that argmax;
        a draft per slot."""
        assert self.kv is not None
        main = self._graphs[rows, query]
        step = self._decode_step(rows, query)
        out = self.model.mtp_forward(main.argmax, main.hidden, step, self.kv)  # type: ignore[attr-defined]
        return argmax_rows(self.model.logits(out))

    def _decode_body(
        self, rows: int, query: int
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Logits, argmax and final hidden states of the persistent buffers' first `rows`
        rows (graph body)."""
        assert self.kv is not None
        hidden = self.model.forward(self._decode_step(rows, query), self.kv)
        logits = self.model.logits(hidden)
        argmax = argmax_rows(logits)
        if query == 1:
            self._prev_tokens[:rows].copy_(argmax)
        return logits, argmax, hidden

    def _with_prev(self, plan: BatchPlan, step: StepTensors) -> StepTensors:
        """`step` with each row's first input resolved from `prev_token_rows`."""
        prev = plan.prev_token_rows
        if prev.size and int(prev.max()) >= 0:
            rows = torch.from_numpy(np.repeat(prev, plan.query_lens)).to(self.device)
            first = np.zeros(plan.num_tokens, dtype=bool)
            first[plan.query_indptr[:-1]] = True
            rows = torch.where(torch.from_numpy(first).to(self.device), rows, -1)
            ids = self._resolve_prev(step.input_ids, rows)
            step = replace(step, input_ids=ids)
        return step
