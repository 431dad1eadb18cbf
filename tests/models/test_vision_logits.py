"""Multimodal reference runners match transformers in fp32 at every position (images at the
start, in the middle, split by chunk boundaries, text after them), and each image is encoded
once however many chunks consume it."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from ref_planner import TinyPlanner
from vision_hf import IMAGE_TOKEN, gemma3_vlm, with_images

from resin_models_torch.registry import load_runner


def _gemma3_hf_logits(hf, tokens: list[int], pixels: list[np.ndarray]) -> torch.Tensor:  # type: ignore[no-untyped-def]
    ids = torch.tensor([tokens])
    with torch.no_grad():
        out = hf(
            input_ids=ids,
            pixel_values=torch.from_numpy(np.stack(pixels)).float() if pixels else None,
            token_type_ids=(ids == IMAGE_TOKEN).long(),
        )
    return out.logits[0].float()


def _worst(runner, seq, reference: torch.Tensor) -> tuple[float, int]:  # type: ignore[no-untyped-def]
    worst, count = 0.0, 0
    for step in runner.recorded:
        mask = step.sequence_ids == seq.sid
        if mask.any():
            pos = torch.from_numpy(step.positions[mask].astype(np.int64))
            diff = (step.logits[torch.from_numpy(mask)] - reference[pos]).abs().max()
            worst, count = max(worst, float(diff)), count + int(mask.sum())
    return worst, count


@pytest.mark.parametrize(("chunk", "page_size"), [(1 << 20, 16), (3, 4), (5, 4)])
def test_gemma3_vision_matches_transformers(chunk: int, page_size: int) -> None:
    folder, hf = gemma3_vlm()
    runner = load_runner(folder, page_size=page_size)
    runner.record_logits = True
    rng = np.random.default_rng(0)
    gen = torch.Generator().manual_seed(1)
    images = [rng.standard_normal((3, 56, 56)).astype(np.float32) for _ in range(3)]
    text = [torch.randint(0, 290, (n,), generator=gen).tolist() for n in (9, 12, 7)]
    cases = [
        with_images(text[0], [0], 4, images[:1], True),  # image first
        with_images(text[1], [5, 9], 4, images[1:3], True),  # two images, text between/after
        with_images(text[2], [], 4, [], True),  # text only, same batch
    ]
    pixels = [images[:1], images[1:3], []]
    seqs = TinyPlanner(runner).run(
        [c[0] for c in cases], max_new=6, chunk=chunk, media=[c[1] for c in cases]
    )
    for seq, pix in zip(seqs, pixels, strict=True):
        reference = _gemma3_hf_logits(hf, seq.tokens[:-1], pix)
        worst, count = _worst(runner, seq, reference)
        assert count == len(seq.tokens) - 1
        assert worst < 1e-4, f"logits differ by {worst}"
    assert runner.media.encoded == 3  # once per image, whatever the chunking
    assert not runner.media.features  # every span consumed: nothing pinned


def test_gemma3_images_change_the_logits() -> None:
    """A control: the comparison above would be vacuous if images did not matter."""
    _, hf = gemma3_vlm()
    rng = np.random.default_rng(3)
    tokens, _ = with_images([5, 6, 7], [1], 4, [np.zeros((3, 56, 56))], True)
    a = _gemma3_hf_logits(hf, tokens, [rng.standard_normal((3, 56, 56)).astype(np.float32)])
    b = _gemma3_hf_logits(hf, tokens, [rng.standard_normal((3, 56, 56)).astype(np.float32)])
    assert float((a[-1] - b[-1]).abs().max()) > 1e-3
    assert torch.equal(a[0], b[0])  # before the image: causal


def test_text_only_runner_refuses_media() -> None:
    from ref_hf import checkpoint

    folder, _ = checkpoint("qwen3")
    runner = load_runner(folder)
    _, items = with_images([1, 2, 3], [1], 4, [np.zeros((3, 56, 56))], False)
    with pytest.raises(ValueError, match="no vision encoder"):
        TinyPlanner(runner).run([[1, IMAGE_TOKEN, IMAGE_TOKEN, 2]], max_new=1, media=[items])
