"""Native recipes by name: `get_native_recipe("qwen3", tokenizer)`."""

from __future__ import annotations

from collections.abc import Callable

from resin.recipe.chatml import ChatMLRecipe, Qwen3Recipe
from resin.recipe.deepseek import DeepSeekV3Recipe
from resin.recipe.deepseek_v4 import DeepSeekV4Recipe
from resin.recipe.glm import Glm45Recipe
from resin.recipe.gpt_oss import GptOssRecipe
from resin.recipe.lfm2 import LFM2Recipe
from resin.recipe.llama3 import Llama3Recipe
from resin.recipe.protocol import Recipe
from resin.tokenizer import Tokenizer

_NATIVE: dict[str, Callable[[Tokenizer], Recipe]] = {
    "chatml": ChatMLRecipe,
    "qwen3": Qwen3Recipe,
    "llama3": Llama3Recipe,
    "deepseek_v3": DeepSeekV3Recipe,
    "deepseek_v4": DeepSeekV4Recipe,
    "lfm2": LFM2Recipe,
    "gpt_oss": GptOssRecipe,
    "glm4_moe": Glm45Recipe,
}


def native_recipe_names() -> tuple[str, ...]:
    return tuple(_NATIVE)


def get_native_recipe(name: str, tokenizer: Tokenizer) -> Recipe:
    """The hand-written recipe `name` bound to `tokenizer`; ValueError for an unknown name or a
    tokenizer that lacks the family's special tokens."""
    factory = _NATIVE.get(name.lower().replace("-", "_"))
    if factory is None:
        raise ValueError(f"unknown recipe {name!r}; native recipes: {', '.join(_NATIVE)}")
    return factory(tokenizer)
