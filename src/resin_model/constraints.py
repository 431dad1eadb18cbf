"""The plan's allowed-token bitmask and logit biases applied to logits, in plain torch on any
device: shared by both runner families (the reference sampler and `CudaRunner`), so it lives in
the shared model description rather than in one of them."""

from __future__ import annotations

import numpy as np
import torch

from resin.plan import SamplingArrays


def constrain_logits(
    logits: torch.Tensor, params: SamplingArrays, rows: np.ndarray
) -> torch.Tensor:
    """The plan's logit biases and allowed-token bitmask applied to the logits of `rows`.

    Returns `logits` itself when the plan has neither; otherwise a new tensor (same dtype) in
    which biased tokens moved by their bias and disallowed tokens are -inf (token t of row i
    is allowed when bit t % 32 of word t // 32 of `token_bitmask[rows[i]]` is set; ids beyond
    the mask's width are disallowed).
    """
    if params.token_bitmask is None and params.bias_ids.size == 0:
        return logits
    out = logits.clone()
    n, vocab = out.shape
    dev = out.device
    if params.bias_ids.size:
        starts = params.bias_indptr[:-1][rows].astype(np.int64)
        counts = (params.bias_indptr[1:][rows] - params.bias_indptr[:-1][rows]).astype(np.int64)
        total = int(counts.sum())
        if total:
            row_of = np.repeat(np.arange(n), counts)
            first = np.repeat(np.cumsum(counts) - counts, counts)
            flat = np.repeat(starts, counts) + np.arange(total) - first
            index = (torch.from_numpy(row_of).to(dev),
                     torch.from_numpy(params.bias_ids[flat].astype(np.int64)).to(dev))  # fmt: skip
            values = torch.from_numpy(params.bias_values[flat]).to(dev, out.dtype)
            out.index_put_(index, values, accumulate=True)
    mask = params.bitmask()  # waits when the engine fills it while the model ran
    if mask is not None:
        words = torch.from_numpy(np.ascontiguousarray(mask[rows]))
        if dev.type == "cuda":  # pinned: the upload queues behind the model, the host goes on
            words = words.pin_memory()
        words = words.to(dev, non_blocking=True)
        shifts = torch.arange(32, device=dev, dtype=torch.int32)
        allowed = ((words[:, :, None] >> shifts) & 1).view(n, -1).bool()
        if allowed.shape[1] < vocab:
            allowed = torch.nn.functional.pad(allowed, (0, vocab - allowed.shape[1]))
        out.masked_fill_(~allowed[:, :vocab], float("-inf"))
    return out
