"""Client libraries nobody here wrote, against the real default model behind the server.

SmolLM2-135M-Instruct (reference runner, real Engine, llguidance) does not follow
instructions well, so these tests hold the protocol, not the wisdom: the library parses every
response, a forced tool call round-trips through the library's own tool machinery, and
schema-constrained output validates into the library's typed result. Constrained decoding is
what makes that reliable. Clients: openai-agents (a function tool, a structured output),
pydantic-ai (typed output through its output tool and through native JSON schema output),
instructor (JSON-schema and tools modes), lm-evaluation-harness (`local-completions`
loglikelihood and `local-chat-completions` generate_until on a local task file).
"""

from __future__ import annotations

import asyncio
import json
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pydantic
import pytest

from resin_app.bench.structured import default_server

pytestmark = pytest.mark.slow


class City(pydantic.BaseModel):
    # extra="forbid" puts additionalProperties: false into the schema, so the grammar keeps
    # the small model from adding keys until max_tokens (pydantic would ignore them).
    model_config = pydantic.ConfigDict(extra="forbid")

    name: str = pydantic.Field(max_length=12)
    population: int = pydantic.Field(ge=0, le=10**8)


@pytest.fixture(scope="module")
def server() -> Iterator[tuple[str, str]]:
    pytest.importorskip("torch")
    try:
        with default_server() as (url, model):
            yield url, model
    except (FileNotFoundError, ImportError) as exc:
        pytest.skip(f"default model unavailable: {exc}")


def _async_client(url: str) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=url + "/v1", api_key="x", max_retries=0, timeout=120)


def test_openai_agents_function_tool_and_structured_output(server: tuple[str, str]) -> None:
    from agents import (
        Agent,
        ModelSettings,
        OpenAIChatCompletionsModel,
        OpenAIResponsesModel,
        Runner,
        function_tool,
        set_tracing_disabled,
    )

    set_tracing_disabled(True)
    url, model = server
    calls: list[str] = []

    @function_tool
    def get_weather(city: str) -> str:
        """The weather in a city."""
        calls.append(city)
        return f"sunny in {city}"

    # The agents default (Responses API): the forced call runs the Python function.
    tool_agent = Agent(
        name="weather",
        instructions="Use the tool.",
        tools=[get_weather],
        model=OpenAIResponsesModel(model, _async_client(url)),
        model_settings=ModelSettings(tool_choice="required", temperature=0, max_tokens=40),
        tool_use_behavior="stop_on_first_tool",
    )
    result = asyncio.run(Runner.run(tool_agent, "What is the weather in Paris?", max_turns=2))
    assert len(calls) == 1 and result.final_output == f"sunny in {calls[0]}"
    # Structured output over chat completions: a strict json_schema response_format.
    typed_agent = Agent(
        name="facts",
        instructions="Answer with the city's name and population.",
        model=OpenAIChatCompletionsModel(model, _async_client(url)),
        model_settings=ModelSettings(temperature=1.0, max_tokens=40),
        output_type=City,
    )
    typed = asyncio.run(Runner.run(typed_agent, "Tell me about Paris.", max_turns=1))
    assert isinstance(typed.final_output, City)


def test_pydantic_ai_typed_output(server: tuple[str, str]) -> None:
    from pydantic_ai import Agent, NativeOutput
    from pydantic_ai.models.openai import OpenAIChatModel
    from pydantic_ai.providers.openai import OpenAIProvider

    url, model = server
    chat = OpenAIChatModel(model, provider=OpenAIProvider(openai_client=_async_client(url)))
    settings: Any = {"temperature": 1.0, "max_tokens": 40}
    # The default: an output tool that the model must call (tool_choice required).
    tool_out = Agent(chat, output_type=City, model_settings=settings, retries=0)
    result = tool_out.run_sync("Tell me about Paris.")
    assert isinstance(result.output, City)
    calls = [p for m in result.all_messages() for p in m.parts if p.part_kind == "tool-call"]
    assert [c.tool_name for c in calls] == ["final_result"]
    # Native structured output: response_format json_schema.
    native = Agent(chat, output_type=NativeOutput(City), model_settings=settings, retries=0)
    assert isinstance(native.run_sync("Tell me about Rome.").output, City)


def test_instructor_json_schema_and_tools_modes(server: tuple[str, str]) -> None:
    import instructor

    url, model = server
    raw = openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0, timeout=120)
    ask = [{"role": "user", "content": "Tell me about Paris."}]
    for mode in (instructor.Mode.JSON_SCHEMA, instructor.Mode.TOOLS):
        client = instructor.from_openai(raw, mode=mode)
        city = client.chat.completions.create(
            model=model, response_model=City, messages=ask, max_tokens=40, max_retries=0
        )
        assert isinstance(city, City), mode


TASKS = """\
task: resin_mini_mc
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
output_type: multiple_choice
doc_to_text: "Question: {{{{question}}}}\\nAnswer:"
doc_to_choice: "{{{{choices}}}}"
doc_to_target: "{{{{answer}}}}"
metric_list:
  - metric: acc
"""
GEN_TASK = """\
task: resin_mini_gen
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
output_type: generate_until
doc_to_text: "{{{{question}}}}"
doc_to_target: "{{{{choices[answer]}}}}"
generation_kwargs:
  until: ["\\n"]
  max_gen_toks: 6
  do_sample: false
metric_list:
  - metric: exact_match
"""
DOCS = [
    {"question": "What is 2 + 2?", "choices": [" 3", " 4", " 5"], "answer": 1},
    {"question": "The capital of France is", "choices": [" Paris", " Rome", " Oslo"], "answer": 0},
    {"question": "Water freezes at zero degrees", "choices": [" Celsius", " Kelvin"], "answer": 0},
]


def _task_dir(tmp_path: Path) -> Path:
    data = tmp_path / "mini.jsonl"
    data.write_text("".join(json.dumps(d) + "\n" for d in DOCS))
    (tmp_path / "mc.yaml").write_text(TASKS.format(data=data))
    (tmp_path / "gen.yaml").write_text(GEN_TASK.format(data=data))
    return tmp_path


def test_lm_eval_local_completions_and_chat(server: tuple[str, str], tmp_path: Path) -> None:
    """lm-eval's loglikelihood (token-id prompts, echo + logprobs, `max_tokens` 0) and
    generate_until (chat completions) requests all parse; every choice gets a finite score."""
    lm_eval = pytest.importorskip("lm_eval")
    from lm_eval.tasks import TaskManager

    from resin_model.default_model import default_model_dir

    url, model = server
    tasks = TaskManager(include_path=str(_task_dir(tmp_path)), include_defaults=False)
    tokenizer = str(default_model_dir())
    mc = lm_eval.simple_evaluate(
        model="local-completions",
        model_args=f"model={model},base_url={url}/v1/completions,tokenizer={tokenizer},"
        "tokenizer_backend=huggingface,num_concurrent=2,max_retries=1",
        tasks=["resin_mini_mc"],
        task_manager=tasks,
        log_samples=True,
    )
    assert mc is not None
    scores = [r[0] for s in mc["samples"]["resin_mini_mc"] for r in s["filtered_resps"]]
    assert len(scores) == sum(len(d["choices"]) for d in DOCS)
    assert all(math.isfinite(x) and x < 0 for x in scores), scores
    assert 0 <= mc["results"]["resin_mini_mc"]["acc,none"] <= 1
    gen = lm_eval.simple_evaluate(
        model="local-chat-completions",
        model_args=f"model={model},base_url={url}/v1/chat/completions,num_concurrent=2",
        tasks=["resin_mini_gen"],
        task_manager=tasks,
        apply_chat_template=True,
        log_samples=True,
    )
    assert gen is not None
    answers = [s["resps"][0][0] for s in gen["samples"]["resin_mini_gen"]]
    assert len(answers) == len(DOCS) and all(isinstance(a, str) and a for a in answers)
