"""Multimodal reference runners match transformers in fp32 at every position (images at the
start, in the middle, split by chunk boundaries, text after them), and each image is encoded
once however many chunks consume it."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from ref_planner import TinyPlanner
from vision_hf import IMAGE_TOKEN, gemma3_vlm, qwen2_5_vl, with_images

from resin.plan import MediaItem
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


def _qwen_hf_logits(hf, tokens: list[int], images: list) -> torch.Tensor:  # type: ignore[no-untyped-def,type-arg]
    ids = torch.tensor([tokens])
    kwargs = {}
    if images:
        kwargs = dict(
            pixel_values=torch.from_numpy(np.concatenate([i.pixel_values for i in images])),
            image_grid_thw=torch.tensor([i.grid_thw for i in images]),
            mm_token_type_ids=(ids == IMAGE_TOKEN).int(),
        )
    with torch.no_grad():
        return hf(input_ids=ids, **kwargs).logits[0].float()  # type: ignore[no-any-return]


@pytest.mark.parametrize(("chunk", "page_size"), [(1 << 20, 16), (5, 4)])
def test_qwen2_5_vl_matches_transformers(chunk: int, page_size: int) -> None:
    from resin.media.qwen2_vl import QwenVisionConfig, qwen_image

    folder, hf = qwen2_5_vl()
    runner = load_runner(folder, page_size=page_size)
    runner.record_logits = True
    rng = np.random.default_rng(0)
    small = QwenVisionConfig(max_pixels=28 * 28 * 12)
    shapes = [(56, 84), (120, 60), (170, 170)]  # 2x2-token windows: 2, 2 and 4 of them
    images = [qwen_image(rng.integers(0, 256, (*s, 3), dtype=np.uint8), small) for s in shapes]
    gen = torch.Generator().manual_seed(2)
    text = [torch.randint(0, 290, (n,), generator=gen).tolist() for n in (9, 12, 7)]
    lengths = [i.num_tokens() for i in images]

    def build(words: list[int], at: list[int], imgs: list) -> tuple[list[int], list]:  # type: ignore[type-arg]
        tokens, items = [], []
        cuts = [0, *at, len(words)]
        for k in range(len(at) + 1):
            tokens += words[cuts[k] : cuts[k + 1]]
            if k < len(at):
                img = imgs[k]
                items.append(
                    MediaItem(
                        0,
                        len(tokens),
                        img.num_tokens(),
                        f"q{k}{len(tokens)}",
                        img.pixel_values,
                        img.grid_thw,
                    )
                )
                tokens += [IMAGE_TOKEN] * img.num_tokens()
        return tokens, items

    cases = [
        build(text[0], [0], images[:1]),
        build(text[1], [4, 8], images[1:3]),
        build(text[2], [], []),
    ]
    pix = [images[:1], images[1:3], []]
    assert lengths == [6, 8, 9]  # merged grids 2x3, 4x2, 3x3 (partial windows)
    seqs = TinyPlanner(runner).run(
        [c[0] for c in cases], max_new=6, chunk=chunk, media=[c[1] for c in cases]
    )
    for seq, imgs in zip(seqs, pix, strict=True):
        worst, count = _worst(runner, seq, _qwen_hf_logits(hf, seq.tokens[:-1], imgs))
        assert count == len(seq.tokens) - 1
        assert worst < 1e-4, f"logits differ by {worst}"
    assert runner.media.encoded == 3
