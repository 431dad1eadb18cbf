"""`resin serve --checkpoint <tiny DeepSeek-V4 folder>` on the CPU: the app loads a
transformers-saved `DeepseekV4ForCausalLM` (with the default model's tokenizer and chat
template) into the reference runner and answers a chat request through the openai SDK with the
greedy continuation transformers computes for the same rendered prompt."""

from __future__ import annotations

import shutil
from pathlib import Path

import openai
import torch
import transformers
from ref_compare import hf_greedy

from resin.server.launch import running
from resin_app.loading import LoadOptions, load
from resin_model.default_model import default_model_dir
from tests.server.conftest import serve_loaded

torch.set_num_threads(1)


def _checkpoint(folder: Path) -> tuple[Path, transformers.PreTrainedModel]:
    source = default_model_dir()
    config = transformers.DeepseekV4Config(
        vocab_size=49152, hidden_size=64, moe_intermediate_size=32, num_hidden_layers=4,
        num_attention_heads=4, head_dim=32, q_lora_rank=32, qk_rope_head_dim=8,
        n_routed_experts=4, num_experts_per_tok=2, compress_ratios=[0, 0, 4, 128],
        compress_rate_hca=16, num_hash_layers=1, sliding_window=16, o_groups=2, o_lora_rank=16,
        index_n_heads=8, index_head_dim=16, index_topk=4, hc_mult=2,
        max_position_embeddings=1024, initializer_range=0.2, bos_token_id=1, eos_token_id=2,
    )  # fmt: skip
    torch.manual_seed(0)
    model = transformers.DeepseekV4ForCausalLM(config).eval()
    model.save_pretrained(folder)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(source / name, folder / name)
    return folder, model


def test_serve_answers_a_chat_request(tmp_path: Path) -> None:
    folder, hf = _checkpoint(tmp_path / "tiny-deepseek-v4")
    loaded = load(LoadOptions(checkpoint=str(folder), context_length=512), progress=False)
    messages = [{"role": "user", "content": "Name three colours."}]
    try:
        with running(serve_loaded(loaded)) as url:
            client = openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0, timeout=60)
            answer = client.chat.completions.create(
                model="default",
                messages=messages,  # type: ignore[arg-type]
                temperature=0,
                max_tokens=8,
                extra_body={"ignore_eos": True},
            )
    finally:
        loaded.close()
    assert answer.usage is not None and answer.usage.completion_tokens == 8
    tokenizer = transformers.AutoTokenizer.from_pretrained(folder)
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    prompt = tokenizer(text, add_special_tokens=False)["input_ids"]
    expected = hf_greedy(hf, list(prompt), 8)
    assert answer.choices[0].message.content == tokenizer.decode(expected)
