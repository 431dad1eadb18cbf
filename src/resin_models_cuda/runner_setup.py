"""What a `CudaRunner` declares to the engine, the plans it refuses, and the tensors of an eager
(varlen) step."""

from __future__ import annotations

import numpy as np
import torch

from resin.plan import BatchPlan, CacheGroupPlan, Phase
from resin.protocols import PENALTY_FEATURES, History, RunnerConfig, State, Window
from resin_model.config import ModelConfig
from resin_model.media_cache import MultimodalModel, StepMedia
from resin_models_cuda.kernels import prefill_blocks
from resin_models_cuda.models import FastModel
from resin_models_cuda.options import RunnerOptions
from resin_models_cuda.step import GroupTensors, MediaTensors, PrefillInfo, StateRows, StepTensors

FEATURES = frozenset(
    {"logprobs", "prompt_logprobs", "logit_bias", "constraint", "seed", "top_k", "top_p", "min_p"}
    | PENALTY_FEATURES
)
"""The optional request features (`resin.protocols.OPTIONAL_FEATURES`) a `CudaRunner`
implements, plus `media` for a model with a vision encoder. Listed, not derived: a new
`SamplingParams` field is refused on this runner until it is implemented and named here."""


def make_runner_config(model: FastModel, options: RunnerOptions) -> RunnerConfig:
    """One cache group per layer kind (History for full attention, Window for sliding), then
    a State group for linear-attention layers (one checkpoint of all of them a page; such a
    model verifies no drafts: its state cannot be rewound)."""
    c, ps = model.config, options.page_size
    declared = model.cache_groups(ps)
    if declared is not None:  # a model with its own groups (DeepSeek-V4)
        token = max(g.bytes_per_page for g in declared if not g.state_region)
        states = [g.bytes_per_page for g in declared if g.state_region]
        budget = options.cache_bytes
        if budget is None and options.num_pages is None:
            budget = 256 * token + 8 * max(states, default=0)  # the CPU default, as below
            if model.device.type == "cuda":
                free, _ = torch.cuda.mem_get_info(model.device)
                budget = int(free * options.memory_fraction)
        return RunnerConfig(
            vocab_size=c.vocab_size, page_size=ps, cache_groups=declared,
            num_pages=options.num_pages, cache_bytes=budget, waits_for_masks=True,
            max_draft_tokens=options.max_draft_tokens
            if all(g.rewinds(options.max_draft_tokens) for g in declared) else 0,
            overlap=options.overlap,
            features=FEATURES,
        )  # fmt: skip
    planes, heads, dim = model.cache_token_shape()
    per_layer = ps * planes * heads * dim * model.dtype.itemsize
    groups: list[History | Window | State] = []
    for kind, layers in zip(model.group_kinds, model.layers_per_group, strict=True):
        if kind == "sliding":
            groups.append(Window(int(c.sliding_window or 0), layers * per_layer))
        else:
            groups.append(History(layers * per_layer))
    page_bytes = max(g.bytes_per_page for g in groups)
    if model.state_bytes():
        groups.append(State(model.state_bytes()))
    cache_bytes = options.cache_bytes
    if cache_bytes is None and options.num_pages is None:
        if model.device.type == "cuda":
            free, _ = torch.cuda.mem_get_info(model.device)
            cache_bytes = int(free * options.memory_fraction)
        else:
            cache_bytes = 256 * page_bytes + 8 * model.state_bytes()
    return RunnerConfig(
        vocab_size=c.vocab_size,
        page_size=ps,
        cache_groups=tuple(groups),
        num_pages=options.num_pages,
        cache_bytes=cache_bytes,
        waits_for_masks=True,  # constrain_logits reads the mask through bitmask()
        max_draft_tokens=0 if model.state_bytes() else options.max_draft_tokens,
        overlap=options.overlap,
        features=FEATURES | {"media"} if isinstance(model, MultimodalModel) else FEATURES,
    )


def check_plan(
    plan: BatchPlan, options: RunnerOptions, max_positions: int, prev_valid: int
) -> None:
    """`ValueError` for a plan the runner cannot take (`prev_valid`: rows of the previous
    plan whose token the runner holds on the device)."""
    if int(plan.total_lens.max(initial=0)) > max_positions:
        raise ValueError(f"context beyond max_context={options.max_context}")
    prev = plan.prev_token_rows
    if prev.size and int(prev.max()) >= prev_valid:
        raise ValueError("prev_token_rows names a row whose token the runner does not hold")
    if plan.draft_ids.size and plan.phase is not Phase.DECODE:
        raise ValueError("drafts in a prefill plan")
    if plan.draft_ids.size:
        drafts = np.diff(plan.draft_indptr)
        if int(drafts.max()) > options.max_draft_tokens:
            raise ValueError(f"more than max_draft_tokens={options.max_draft_tokens}")
        if np.any(plan.query_lens != 1 + drafts):
            raise ValueError("a row with k drafts needs 1 + k query tokens")
    elif plan.phase is Phase.DECODE and plan.num_tokens != plan.num_sequences:
        raise ValueError("a decode row without drafts has one query token")


def copy_pages(plan: BatchPlan, kv: torch.Tensor, state: torch.Tensor | None = None) -> None:
    """The plan's copy-on-write page copies, before anything reads the arena (a State
    group's in the State region `state`)."""
    for group in plan.cache_groups:
        if group.copy_src.shape[0]:
            arena = state if group.state_in.shape[0] and state is not None else kv
            src = torch.from_numpy(group.copy_src.astype(np.int64)).to(kv.device)
            dst = torch.from_numpy(group.copy_dst.astype(np.int64)).to(kv.device)
            arena[dst] = arena[src]


def state_rows(plan: BatchPlan, region: torch.Tensor) -> StateRows | None:
    """The device tensors of the plan's (first) State group (None without one): a State
    group's plan is the one with a `state_in` per row."""
    rows = all_state_rows(plan, region)
    return rows[0] if rows else None


def all_state_rows(plan: BatchPlan, region: torch.Tensor) -> tuple[StateRows, ...]:
    """The device tensors of each State group of the plan, in order."""
    groups = [g for g in plan.cache_groups if g.state_in.shape[0]]
    return tuple(_state_rows(plan, g, region) for g in groups)


def _state_rows(plan: BatchPlan, g: CacheGroupPlan, region: torch.Tensor) -> StateRows:
    lens = plan.query_lens.astype(np.int64)
    indptr = g.checkpoint_indptr if g.checkpoint_indptr.shape[0] else np.zeros(len(lens) + 1)
    rows = np.repeat(np.arange(plan.num_sequences), np.diff(indptr).astype(np.int64))
    # A checkpoint after flat query token i covers the row's tokens up to and including i.
    covered = g.checkpoint_token.astype(np.int64) - plan.query_indptr[rows] + 1
    pad = np.zeros(1, dtype=np.int64)  # the kernels read one entry past a row's last
    arrays = (
        plan.query_indptr,
        np.repeat(np.arange(plan.num_sequences), lens),
        g.state_in,
        g.state_out,
        indptr,
        np.concatenate((covered, pad)),
        np.concatenate((g.checkpoint_page.astype(np.int64), pad)),
    )
    query_indptr, token_row, state_in, state_out, ckpt_indptr, ckpt_len, ckpt_page = (
        torch.from_numpy(np.array(a, dtype=np.int32)).to(region.device) for a in arrays
    )
    return StateRows(region, query_indptr, token_row, state_in, state_out, ckpt_indptr,
                     ckpt_len, ckpt_page)  # fmt: skip


def prefill_step(
    plan: BatchPlan,
    options: RunnerOptions,
    config: ModelConfig,
    dtype: torch.dtype,
    device: torch.device,
    media: StepMedia | None = None,
    state: torch.Tensor | None = None,
) -> StepTensors:
    """Device tensors of a varlen step (prefill chunks, or decode rows run eagerly), with the
    step's image features and each query token's bidirectional span end (`media`), and its
    State group's rows over the State region `state`."""
    block_m = options.prefill_block_m if device.type == "cuda" else 16
    if dtype == torch.float32:
        block_m = min(block_m, 64)  # float32 tiles need twice the shared memory
    if config.head_dim * dtype.itemsize > 512:
        block_m = min(block_m, 32)  # wide float32 heads (Gemma's 256)
    block_row, block_off = prefill_blocks(plan.query_indptr, block_m)

    def dev(a: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(np.array(a, dtype=np.int32)).to(device)

    groups = tuple(
        GroupTensors(
            dev(g.append_slots), dev(g.page_indptr), dev(g.page_ids), dev(g.page_start),
            dev(g.entry_indptr) if g.entry_indptr.size else None,
            torch.from_numpy(g.entry_slots.astype(np.int64)).to(device)
            if g.entry_indptr.size else None,
        )
        for g in plan.cache_groups
    )  # fmt: skip
    span_end = tensors = None
    if media is not None:
        index = torch.from_numpy(media.token_index).to(device)
        tensors = MediaTensors(index, media.features.to(device))
        if media.spans:
            ends = np.full(plan.num_tokens, -1, dtype=np.int32)
            for row, lo, hi in media.spans:  # the span's last sequence position
                first = int(plan.query_indptr[row])
                ends[first + lo : first + hi] = int(plan.cached_lens[row]) + hi - 1
            span_end = dev(ends)
    info = PrefillInfo(
        dev(plan.query_indptr),
        dev(plan.cached_lens),
        dev(block_row),
        dev(block_off),
        block_m,
        span_end,
    )
    rows = None if state is None else state_rows(plan, state)
    every = () if state is None else all_state_rows(plan, state)
    return StepTensors(dev(plan.input_ids), dev(plan.positions), groups, info, tensors, rows, every)
