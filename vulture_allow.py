# Names `vulture src vulture_allow.py --min-confidence 60` (make lint) reports as unused
# but that are used: each entry says by whom. This file is read by vulture, never executed.
# Entries marked `TODO(owner area)` are findings outside engine/cache/contracts/metrics that the
# owner of that area should delete or justify.
# ruff: noqa

# -- engine / cache / contracts / metrics: justified --
_.writeable  # numpy `arr.flags.writeable = False` freezes plan arrays (a numpy attribute)
tb  # Ticket.__exit__ (server/intake.py): the context-manager protocol's signature
# MetricsSnapshot fields the Prometheus exporter reads by name from its tables (getattr):
kv_cache_usage_perc, prefix_cache_usage_perc, time_to_first_token_seconds
inter_token_latency_seconds, e2e_request_latency_seconds, request_queue_time_seconds
request_prefill_time_seconds, request_decode_time_seconds, iteration_tokens_total
_.finished  # Request.finished: public API for callers (docs/engine.md)
_.drop_prefix_cache  # CacheManager: empties the trie; tests use it to prove no page leaks
_.num_nodes  # PrefixTrie.num_nodes: trie size, read by tests/engine/test_prefix.py
num_output_tokens  # FinishedEvent field: public event contract, read by the server and users
request_ids  # ErrorEvent field: public event contract
retryable  # ErrorEvent field: public event contract
checkpoint_indptr  # CacheGroupPlan field: runner contract (tests/engine/fakes.py honours it)
entry_slots, entry_token  # CacheGroupPlan Compressed fields: runner contract (tests/engine/fakes.py)
content_type  # PrometheusExporter.content_type: public, what to serve /metrics with
_.cached_bytes  # GrammarBackend.cached_bytes: public, read by tests/engine/test_grammar_limits.py

# -- other areas --
load_average  # resin_app/bench/cpu.py: a dataclass field written to the JSONL record
multimodal  # TODO(recipe) recipe/protocol.py:31: a rendered-prompt field nothing reads yet
_.feed_text  # TODO(recipe) recipe/protocol.py, recipe/stream.py: parser API unused in src
_.unsafe_undefined  # recipe/sandbox.py: a jinja2 sandbox override (jinja2 calls it)
_.intercepted_binops, _.call_binop  # recipe/sandbox.py: jinja2 sandbox hooks (jinja2 calls them)
# recipe/sandbox.py: jinja2 NodeTransformer visitors (dispatched by node class name), and the
# helpers the rewritten templates import by name (`nodes.ImportedName`)
_.visit_Concat, _.visit_Filter, _.visit_FilterBlock, _.visit_AssignBlock
bounded_iter, measured
count_tokens  # server/anthropic_messages.py: a FastAPI route (registered by decorator)
chat_completions  # server/openai_chat.py: a FastAPI route (registered by decorator)
completions  # server/openai_completions.py: a FastAPI route (registered by decorator)
create_response  # server/responses.py: a FastAPI route (registered by decorator)
media_type  # server/asgi.py:108: Starlette response class attribute (read by Starlette)
_.background  # server/asgi.py:114: Starlette response attribute (read by Starlette)
budget_tokens  # server/schemas_anthropic.py: a request-body field (pydantic parses it)
add_bos_token  # TODO(tokenizer) tokenizer.py:28
_.bos_token_id  # TODO(tokenizer) tokenizer.py:95; resin_model/config.py:84
bos_token_id  # TODO(gpu) resin_model/config.py:84
mean_agreed_prefix  # TODO(gpu) resin_models_cuda/validate.py:38
mismatch_margins  # TODO(gpu) resin_models_cuda/validate.py:42
_.agree_fraction  # TODO(gpu) resin_models_cuda/validate.py:49
np_index  # TODO(gpu) resin_models_torch/batch.py:27
_.pre_tokenizer  # resin_model/gguf_tokenizer.py: `tokenizers` settings (assigned)
_.decoder  # resin_model/gguf_tokenizer.py: `tokenizers` settings (assigned)
_.post_processor  # resin_model/gguf_tokenizer.py: `tokenizers` settings (assigned)
_.normalizer  # resin_model/gguf_tokenizer.py: `tokenizers` settings (assigned)
random_runner  # TODO(gpu) resin_models_torch/registry.py: public helper, used by tests only
_.accepting  # engine/grammar.py: GrammarState's public read of the matcher (tests assert it)
response_format  # server/schemas_openai.py: a request-body field (structured.py reads it by name)
_.persistent_id  # backend/distributed.py: pickle.Pickler hook (pickle calls it)
_.persistent_load  # backend/distributed.py: pickle.Unpickler hook (pickle calls it)
spawn_local  # backend/launch.py: public API (docs/distributed.md), used by tests
_.out_features  # resin_models_torch/parallel.py: nn.Linear attributes kept true after sharding
_.in_features  # resin_models_torch/parallel.py: nn.Linear attributes kept true after sharding
_.weight_bytes  # resin_app/bench/runner_bench.py: a benchmark record field read by reports
_.last_logits  # resin_models_cuda/runner.py: RunnerOptions.keep_logits output (tests/cuda read it)
expert_bias  # resin_model/config.py: a config field (layers read it through MoeConfig)
GptOss  # resin_models_cuda/models: loaded by name through resin_models_cuda/architectures.py
Deepseek, Olmo2, Glm4Moe, Qwen3_5Moe  # resin_models_cuda/models: loaded by name through resin_models_cuda/architectures.py
Glm4MoeForCausalLM  # resin_models_torch: loaded by name through architectures.py
Gemma3ForCausalLM  # resin_models_torch: loaded by name through architectures.py
Qwen2_5_VLForConditionalGeneration  # resin_models_torch: loaded by name through architectures.py
Gemma3ForConditionalGeneration  # resin_models_torch: loaded by name through architectures.py
qwen_video  # resin/media/qwen2_vl.py: public preprocessing API (docs/vision.md); no Qwen-VL runner yet
pixel_values  # QwenPatches field: the tensor a Qwen-VL runner takes (tests/media read it)
_.encoded  # MediaEncoderCache.encoded: encoder calls, read by tests/models/test_vision_logits.py
image_token_id  # VisionConfig field: the placeholder id of the checkpoint (read by the server)
GptOssForCausalLM  # resin_models_torch: loaded by name through architectures.py
Lfm2ForCausalLM  # resin_models_torch: loaded by name through architectures.py
Olmo2ForCausalLM  # resin_models_torch: loaded by name through architectures.py
Qwen3MoeForCausalLM  # resin_models_torch: loaded by name through architectures.py
Qwen3_5MoeForCausalLM  # resin_models_torch: loaded by name through architectures.py
Glm5NextForConditionalGeneration  # resin_models_torch: loaded by name through architectures.py
HyperHead  # resin_models_torch.mhc: DeepSeek-V4's final collapse (GLM-5.3 takes the mean)
DeepseekForCausalLM  # resin_models_torch: loaded by name through architectures.py
DeepseekV4ForCausalLM  # resin_models_torch: loaded by name through architectures.py
MtpProposer  # resin_models_torch/mtp.py: handed to the engine as a speculative proposer (docs/models.md)
get_response  # server/responses.py: a FastAPI route (the router calls it)
delete_response  # server/responses.py: a FastAPI route (the router calls it)
get_input_items  # server/responses.py: a FastAPI route (the router calls it)
favicon  # server/misc.py: a FastAPI route (the router calls it)
_.chunked_encoding  # server/connection_limits.py: uvicorn's cycle reads it when it writes the headers
_.encode_special_tokens  # tokenizer.py: a `tokenizers.Tokenizer` setting (read by the Rust side)
DraftModelProposer  # resin.engine.proposers: a public Proposer (tests and docs use it; spec exports it)
# resin_model/quant.py, quant_config.py: the quantized formats' math and QuantConfig, read by the
# checkpoint loaders that come next (tests/models/test_quant*.py, tests/cuda/test_quant_kernels.py)
dequantize_fp8, quantize_fp8_activations, dequantize_mxfp4, quantize_mxfp4, parse_quant_config
scale_name, activation_group, _.quantizes, _.weight_block
FAMILY  # resin_models_torch/family.py, resin_models_cuda/family.py: `resin.runners` entry points (pyproject.toml)
family_names  # resin_app/runners.py: public API (the installed families' names without importing them)
_.__class__  # resin_models_cuda.parallel: a sharded model moves into its TensorParallel subclass
