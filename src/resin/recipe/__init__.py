"""Chat recipes: conversation rendering and incremental response parsing (pure Python).

`Message`/content blocks describe a conversation; a `Recipe` renders it into prompt token ids
and creates a `ResponseParser` that turns generated ids into typed deltas (text, reasoning,
tool calls). Native recipes are hand-written per family; `JinjaRecipe` renders any checkpoint's
own chat template in a sandbox; `load_recipe` picks one for a tokenizer.
"""

from resin.recipe.deltas import (
    Delta,
    FinishReason,
    ParseResult,
    ReasoningDelta,
    TextDelta,
    ToolCallArgsDelta,
    ToolCallEnd,
    ToolCallStart,
)
from resin.recipe.jinja_recipe import JinjaRecipe, load_recipe
from resin.recipe.protocol import Recipe, RenderedPrompt, ResponseParser
from resin.recipe.registry import get_native_recipe, native_recipe_names
from resin.recipe.tool_choice import ToolChoice, UnsupportedToolChoice
from resin.recipe.types import (
    Image,
    Message,
    Reasoning,
    Role,
    Text,
    ToolCall,
    ToolDef,
    ToolResult,
)

__all__ = [
    "Delta",
    "FinishReason",
    "Image",
    "JinjaRecipe",
    "Message",
    "ParseResult",
    "Reasoning",
    "ReasoningDelta",
    "Recipe",
    "RenderedPrompt",
    "ResponseParser",
    "Role",
    "Text",
    "TextDelta",
    "ToolCall",
    "ToolCallArgsDelta",
    "ToolCallEnd",
    "ToolCallStart",
    "ToolChoice",
    "ToolDef",
    "ToolResult",
    "UnsupportedToolChoice",
    "get_native_recipe",
    "load_recipe",
    "native_recipe_names",
]
