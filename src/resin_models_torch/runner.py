"""`TorchRunner`: runs any reference model (`CausalLM`) against the Engine's frozen plans.

Life cycle: the engine reads `runner_config` (vocabulary, page size, cache groups with honest
per-page byte counts, cache budget), sizes the one physical arena and calls `bind(layout)`
once; the runner allocates ONE uint8 tensor of `layout.arena_bytes` bytes (the token region,
then the state region) and views it per group (KV: [pages, layers, 2, page_size, kv_heads,
head_dim]; MLA latent: [pages, layers, page_size, width]; conv state: [state pages, layers,
channels, K-1]). Each `forward(plan)` does the
plan's page copies first, runs the model on the step's flat tokens, samples the sampling rows
and returns a `ForwardOutput`; device results reach the host in one transfer at the end.

It is also an overlapping `AsyncRunner` (`overlap=True`, the default): `submit(plan)` runs the
step at once and keeps its sampled tokens as a tensor (one per plan row, -1 where a row did
not sample), from which the next plan's `prev_token_rows` are resolved; `collect()` returns
the outputs in submission order. On a CPU that hides nothing, but it runs the engine's
pipelined path against a real model.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, replace

import numpy as np
import torch

from resin.plan import BatchPlan, ForwardOutput
from resin.protocols import (
    OPTIONAL_FEATURES,
    CacheGroupSpec,
    CacheLayout,
    Compressed,
    History,
    RunnerConfig,
    State,
    Window,
)
from resin_models_torch.base import CausalLM
from resin_models_torch.batch import (
    AttentionBatch,
    BufferSpec,
    CacheSpec,
    EntryBatch,
    EntrySpec,
    KvSpec,
    LatentSpec,
    LinearStateSpec,
    StateBatch,
    StepContext,
    attention_batch,
    entry_batch,
    make_grid,
    state_batch,
)
from resin_models_torch.media_step import MediaEncoderCache
from resin_models_torch.sampler import Sampler
from resin_models_torch.verify import draft_layout, verify

DEFAULT_CACHE_BYTES = 256 * 1024 * 1024
MAX_LOGPROBS = 20
MAX_DRAFT_TOKENS = 16


@dataclass(frozen=True, slots=True)
class RecordedStep:
    """Debug record of one step: logits [T, V] (`record_logits=True`) and/or final hidden
    states [T, hidden] (`record_hidden=True`, cheap for large vocabularies) of every token."""

    step_id: int
    sequence_ids: np.ndarray  # [T] request id of each token
    positions: np.ndarray  # [T]
    logits: torch.Tensor | None  # [T, V] float32, on the host
    hidden: torch.Tensor | None = None  # [T, hidden] float32, on the host


class TorchRunner:
    """A synchronous runner around a reference model. Not thread-safe (one engine drives it)."""

    def __init__(
        self,
        model: CausalLM,
        *,
        page_size: int = 16,
        cache_bytes: int = DEFAULT_CACHE_BYTES,
        num_pages: int | None = None,
        seed: int = 0,
        overlap: bool = True,
    ) -> None:
        self.model = model.eval()
        self.overlap = overlap
        weight = model.model.embed_tokens.weight
        self.device, self.dtype = weight.device, weight.dtype
        self.page_size = page_size
        self.cache_bytes = cache_bytes
        self.num_pages = num_pages
        self.sampler = Sampler(self.device, seed)
        self.accept_first: int | None = None  # bench only: force-accept this many drafts
        self.record_logits = False
        self.record_hidden = False
        self.recorded: list[RecordedStep] = []
        self._arena: torch.Tensor | None = None
        self._views: tuple[torch.Tensor, ...] = ()
        self.media = MediaEncoderCache(model)
        self._sampled = torch.zeros(0, dtype=torch.long)
        """Token each row of the last accepted plan sampled (-1: none), on the device."""
        self._waiting: deque[ForwardOutput | Exception] = deque()
        self._deferred: BatchPlan | None = None
        """A submitted plan whose mask the engine fills later (it runs at the next submit or
        collect, in order)."""

    @property
    def vocab_size(self) -> int:
        return self.model.config.vocab_size

    def _group_bytes(self, spec: CacheSpec) -> int:
        size = torch.tensor([], dtype=self.dtype).element_size()
        if isinstance(spec, KvSpec):
            return spec.num_layers * 2 * self.page_size * spec.num_kv_heads * spec.head_dim * size
        if isinstance(spec, LatentSpec):
            return spec.num_layers * self.page_size * spec.width * size
        if isinstance(spec, EntrySpec):
            return spec.num_layers * self._per_page(spec) * spec.width * size
        if isinstance(spec, BufferSpec):
            return spec.num_layers * spec.tokens * spec.width * size
        if isinstance(spec, LinearStateSpec):
            return spec.num_layers * spec.layer_bytes(size)
        return spec.num_layers * spec.channels * spec.width * size

    def _per_page(self, spec: EntrySpec) -> int:
        return Compressed(spec.ratio).entries_per_page(self.page_size)

    def _group_spec(self, spec: CacheSpec) -> CacheGroupSpec:
        nbytes = self._group_bytes(spec)
        if isinstance(spec, EntrySpec):
            return Compressed(ratio=spec.ratio, bytes_per_page=nbytes)
        if isinstance(spec, LatentSpec) and spec.window is None:
            return History(bytes_per_page=nbytes)
        if isinstance(spec, BufferSpec):
            return State(bytes_per_page=nbytes, rewind=spec.rewind)
        if not isinstance(spec, KvSpec | LatentSpec):
            return State(bytes_per_page=nbytes)
        if spec.window is None:
            return History(bytes_per_page=nbytes)
        return Window(size=spec.window, bytes_per_page=nbytes)

    @property
    def runner_config(self) -> RunnerConfig:
        return RunnerConfig(
            vocab_size=self.vocab_size,
            page_size=self.page_size,
            cache_groups=tuple(self._group_spec(s) for s in self.model.cache_specs),
            num_pages=self.num_pages,
            cache_bytes=self.cache_bytes,
            max_logprobs=MAX_LOGPROBS,
            waits_for_masks=True,
            overlap=self.overlap,
            max_draft_tokens=MAX_DRAFT_TOKENS,
            layer_groups=self.model.layer_groups,
            # every optional feature; images only through a model with a vision encoder
            features=OPTIONAL_FEATURES if self.media.model else OPTIONAL_FEATURES - {"media"},
        )

    def bind(self, layout: CacheLayout) -> None:
        """Allocate the arena the engine sized (once) and carve the per-group views."""
        expected = self.runner_config
        if layout.page_size != self.page_size or layout.groups != expected.cache_groups:
            raise ValueError(f"layout {layout} does not match this runner's {expected}")
        if (
            layout.page_bytes < expected.page_bytes
            or layout.state_page_bytes < expected.state_page_bytes
        ):
            raise ValueError("layout pages are smaller than the cache groups need")
        # One allocation: the token region, then the state region (resin.protocols).
        arena = torch.zeros(layout.arena_bytes, dtype=torch.uint8, device=self.device)
        token_bytes = layout.num_pages * layout.page_bytes
        pages = arena[:token_bytes].view(layout.num_pages, layout.page_bytes)
        states = arena[token_bytes:].view(layout.state_pages, layout.state_page_bytes)
        views = []
        for spec in self.model.cache_specs:
            if isinstance(spec, LinearStateSpec):  # mixed dtypes: layers split their bytes
                raw = states[:, : self._group_bytes(spec)]
                views.append(raw.view(layout.state_pages, spec.num_layers, -1))
                continue
            shape: tuple[int, ...]
            region = pages
            if isinstance(spec, KvSpec):
                shape = (spec.num_layers, 2, self.page_size, spec.num_kv_heads, spec.head_dim)
            elif isinstance(spec, LatentSpec):
                shape = (spec.num_layers, self.page_size, spec.width)
            elif isinstance(spec, EntrySpec):
                shape = (spec.num_layers, self._per_page(spec), spec.width)
            elif isinstance(spec, BufferSpec):
                shape = (spec.num_layers, spec.tokens, spec.width)
                region = states
            else:
                shape = (spec.num_layers, spec.channels, spec.width)
                region = states
            flat = region[:, : self._group_bytes(spec)].view(self.dtype)
            views.append(flat.view(region.shape[0], *shape))
        self._arena, self._views = pages, tuple(views)

    def close(self) -> None:
        self._arena, self._views = None, ()

    def submit(self, plan: BatchPlan) -> None:
        """Run the step now (a plan whose mask is still pending: at the next submit or
        collect, as the engine fills it only after the step before it is committed); its
        output waits for `collect` (at most two wait)."""
        self._run_deferred()
        if len(self._waiting) >= 2:
            raise RuntimeError("two plans are already waiting for collect()")
        if plan.sampling.mask_pending is not None:
            self._deferred = plan
        else:
            self._waiting.append(self.forward(plan))

    def collect(self) -> ForwardOutput:
        if not self._waiting:
            self._run_deferred()
        if not self._waiting:
            raise RuntimeError("collect() without a submitted plan")
        out = self._waiting.popleft()
        if isinstance(out, Exception):
            raise out
        return out

    def _run_deferred(self) -> None:
        plan, self._deferred = self._deferred, None
        if plan is not None:
            try:
                self._waiting.append(self.forward(plan))
            except Exception as exc:  # reported by its collect
                self._waiting.append(exc)

    def forward(self, plan: BatchPlan) -> ForwardOutput:
        if self._arena is None:
            raise RuntimeError("TorchRunner.bind(layout) must be called before forward")
        if plan.num_tokens and int(plan.input_ids.max()) >= self.vocab_size:
            raise ValueError("token id out of the model's vocabulary")
        with torch.inference_mode():
            ids = self._input_ids(plan)
            self._copy_pages(plan)
            ctx = self.media.attach(plan, self._context(plan))
            hidden = self.model(ids, ctx)
            return self._outputs(plan, hidden)

    def _input_ids(self, plan: BatchPlan) -> torch.Tensor:
        """The step's tokens, rows with `prev_token_rows` taken from the last plan's samples."""
        ids = torch.from_numpy(plan.input_ids.astype(np.int64)).to(self.device)
        prev = plan.prev_token_rows
        if prev.size and (prev >= 0).any():
            rows = np.flatnonzero(prev >= 0)
            if int(prev.max()) >= self._sampled.numel():
                raise ValueError("prev_token_rows points past the previous plan's rows")
            src = torch.from_numpy(prev[rows].astype(np.int64)).to(self.device)
            firsts = torch.from_numpy(plan.query_indptr[rows].astype(np.int64)).to(self.device)
            ids[firsts] = self._sampled[src]
        if plan.num_tokens and int(ids.min()) < 0:
            raise ValueError("an input token is -1 and no previous row sampled it")
        return ids

    def _copy_pages(self, plan: BatchPlan) -> None:
        assert self._arena is not None
        for group in plan.cache_groups:
            for src, dst in zip(group.copy_src.tolist(), group.copy_dst.tolist(), strict=True):
                self._arena[dst] = self._arena[src]

    def _context(self, plan: BatchPlan) -> StepContext:
        grid = make_grid(plan, self.device)
        batches: list[AttentionBatch | StateBatch | EntryBatch] = []
        for spec, group in zip(self.model.cache_specs, plan.cache_groups, strict=True):
            if isinstance(spec, KvSpec | LatentSpec):
                batches.append(
                    attention_batch(plan, group, grid, self.page_size, spec.window, self.device)
                )
            elif isinstance(spec, EntrySpec):
                per_page = self._per_page(spec)
                batches.append(entry_batch(plan, group, spec.ratio, per_page, self.device))
            elif isinstance(spec, BufferSpec):
                batches.append(state_batch(plan, group, grid, 1, self.device))
            else:
                batches.append(state_batch(plan, group, grid, spec.width, self.device))
        positions = torch.from_numpy(plan.positions.astype(np.int64)).to(self.device)
        return StepContext(positions, tuple(batches), self._views)

    def _outputs(self, plan: BatchPlan, hidden: torch.Tensor) -> ForwardOutput:
        if plan.draft_ids.size:
            return self._verify(plan, hidden)
        rows = np.nonzero(plan.sample_rows)[0]
        last = torch.from_numpy(plan.last_token_index[rows].astype(np.int64)).to(self.device)
        indptr = np.concatenate(([0], np.cumsum(plan.sample_rows))).astype(np.uint32)
        token_rows = np.repeat(np.arange(plan.num_sequences), plan.query_lens)
        prompt_tokens = np.nonzero(plan.prompt_logprob_rows[token_rows] & (plan.target_ids >= 0))[0]
        wants_prompt = bool(plan.prompt_logprob_rows.any())
        all_logits = None
        if self.record_logits or wants_prompt:
            all_logits = self.model.logits(hidden)
            logits = all_logits[last]
        else:
            logits = self.model.logits(hidden[last])
        result = self.sampler.sample(logits, plan.sampling, rows)
        self._sampled = torch.full((plan.num_sequences,), -1, dtype=torch.long, device=self.device)
        self._sampled[torch.from_numpy(rows).to(self.device)] = result.token_ids
        wants = int(plan.sampling.logprobs[rows].max(initial=-1))
        output = ForwardOutput(
            token_ids=_host(result.token_ids).astype(np.uint32),
            token_indptr=indptr,
            logprobs=_host(result.logprobs).astype(np.float32) if wants >= 0 else None,
            top_ids=_host_or_none(result.top_ids, np.int32),
            top_logprobs=_host_or_none(result.top_logprobs, np.float32),
        )
        if all_logits is not None and wants_prompt:  # arrays even when no target is known yet
            lp, ids, top_lp = self._prompt_logprobs(plan, all_logits, prompt_tokens)
            output = replace(
                output, prompt_logprobs=lp, prompt_top_ids=ids, prompt_top_logprobs=top_lp
            )
        if self.record_logits or self.record_hidden:
            self.recorded.append(
                RecordedStep(
                    plan.step_id,
                    plan.sequence_ids[token_rows].copy(),
                    plan.positions.copy(),
                    all_logits.float().cpu() if all_logits is not None else None,
                    hidden.float().cpu() if self.record_hidden else None,
                )
            )
        return output

    def _verify(self, plan: BatchPlan, hidden: torch.Tensor) -> ForwardOutput:
        """A step whose rows carry drafts (`verify.py` gives the rule)."""
        layout = draft_layout(plan)
        logits = self.model.logits(hidden[torch.from_numpy(layout.token_index).to(self.device)])
        result = verify(logits, plan, layout, self.sampler, self.accept_first)
        return result.to_output(plan, layout)

    def _prompt_logprobs(
        self, plan: BatchPlan, logits: torch.Tensor, tokens: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray | None, np.ndarray | None]:
        """Logprob of each next prompt token, plus the top-k alternatives the rows ask for
        (the plan's `prompt_logprobs` column when it has one, else MAX_LOGPROBS)."""
        t = plan.num_tokens
        k = _prompt_top_k(plan, MAX_LOGPROBS)
        index = torch.from_numpy(tokens.astype(np.int64)).to(self.device)
        targets = torch.from_numpy(plan.target_ids[tokens].astype(np.int64)).to(self.device)
        lp = torch.log_softmax(logits[index].float(), dim=-1)
        logprobs = np.full(t, np.nan, dtype=np.float32)
        logprobs[tokens] = _host(lp.gather(1, targets[:, None])[:, 0])
        if k <= 0:
            return logprobs, None, None
        top_lp, top_ids = lp.topk(min(k, lp.shape[1]), dim=-1)
        ids = np.full((t, top_ids.shape[1]), -1, dtype=np.int32)
        lps = np.full((t, top_ids.shape[1]), np.nan, dtype=np.float32)
        ids[tokens], lps[tokens] = _host(top_ids), _host(top_lp)
        return logprobs, ids, lps


def _prompt_top_k(plan: BatchPlan, default: int) -> int:
    # A plan without the per-row prompt_logprobs column gets the most we support.
    column = plan.sampling.prompt_logprobs
    if not column.size:
        return default
    return int(np.max(np.where(plan.prompt_logprob_rows, column, -1), initial=-1))


def _host(tensor: torch.Tensor) -> np.ndarray:
    """Device -> host numpy; results cross once, at the end of the step."""
    array: np.ndarray = tensor.detach().cpu().numpy()
    return array


def _host_or_none(tensor: torch.Tensor | None, dtype: type) -> np.ndarray | None:
    return None if tensor is None else _host(tensor).astype(dtype)
