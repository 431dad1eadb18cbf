"""The installed runner families, found through the `resin.runners` entry points
(`resin_model/family.py` is the contract): which families serve an architecture, and a runner
for a checkpoint (or a config's random weights) from a named family.

Nothing is cached: an entry point loads on each call, so a package installed (or a path added)
while the process runs is seen. Only the named family's module is imported by `runner_family`
and `build_runner`; `installed_families` imports them all and reports, rather than raises,
the ones that fail to import (a CPU machine without Triton still lists `torch`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from importlib.metadata import EntryPoint, entry_points
from pathlib import Path

from resin.protocols import Runner
from resin_model.config import ModelConfig
from resin_model.family import ENTRY_POINT_GROUP, BuildRequest, ModelSource, RunnerFamily
from resin_model.hf_config import load_config


@dataclass(frozen=True)
class Installed:
    """Every family whose entry point loads, by name, and why the others did not."""

    families: dict[str, RunnerFamily] = field(default_factory=dict)
    broken: dict[str, str] = field(default_factory=dict)


def _entry_points() -> dict[str, EntryPoint]:
    return {ep.name: ep for ep in entry_points(group=ENTRY_POINT_GROUP)}


def _load(ep: EntryPoint) -> RunnerFamily:
    family = ep.load()
    if not isinstance(family, RunnerFamily):
        raise TypeError(f"{ep.value} is a {type(family).__name__}, not a RunnerFamily")
    if family.name != ep.name:
        raise ValueError(f"{ep.value} is named {family.name!r}, its entry point {ep.name!r}")
    return family


def family_names() -> list[str]:
    """The names of the installed families (nothing imported)."""
    return sorted(_entry_points())


def runner_family(name: str) -> RunnerFamily:
    """The installed family `name` (only its module is imported)."""
    eps = _entry_points()
    if name not in eps:
        known = ", ".join(sorted(eps)) or "none (is resin installed? pip install -e .)"
        raise ValueError(f"no runner family {name!r}; installed: {known}")
    try:
        return _load(eps[name])
    except (ImportError, TypeError) as exc:
        raise ValueError(
            f"runner family {name!r} ({eps[name].value}) does not load: {exc}"
        ) from exc


def installed_families() -> Installed:
    """Every installed family that loads, and the reason for each one that does not."""
    installed = Installed()
    for name, ep in sorted(_entry_points().items()):
        try:
            installed.families[name] = _load(ep)
        except (ImportError, TypeError, ValueError) as exc:
            installed.broken[name] = f"{type(exc).__name__}: {exc}"
    return installed


def families_serving(model_type: str) -> list[RunnerFamily]:
    """The loadable families that serve `model_type`, by name."""
    return [f for f in installed_families().families.values() if f.serves(model_type)]


def model_type_of(source: ModelSource) -> str:
    """The `model_type` of a config, or of a checkpoint folder's config.json."""
    config = source if isinstance(source, ModelConfig) else load_config(Path(source))
    return config.model_type


def build_runner(source: ModelSource, family: str, request: BuildRequest | None = None) -> Runner:
    """A runner from family `family` for a checkpoint folder or a config (random weights);
    a family that does not serve the architecture is refused before anything loads."""
    chosen = runner_family(family)
    model_type = model_type_of(source)
    if not chosen.serves(model_type):
        others = [f.name for f in families_serving(model_type)]
        raise ValueError(
            f"runner family {family!r} does not serve model_type {model_type!r}"
            + (f"; {', '.join(others)} does" if others else "")
        )
    return chosen.build(
        Path(source) if isinstance(source, str) else source, request or BuildRequest()
    )


RUNNER_CHOICES = ("auto", "cuda", "torch")
"""`--runner`: `auto` picks the fast family where it applies, the others name a family."""


@dataclass(frozen=True, slots=True)
class RunnerChoice:
    """The family `resin serve` builds, and why `auto` did not take the fast one (None when
    it did, or when the family was named)."""

    family: str
    reason: str | None = None


def choose_family(
    requested: str,
    *,
    device: str,
    model_type: str,
    fast: frozenset[str] | None,
    tensor_parallel: int = 1,
) -> RunnerChoice:
    """`--runner auto|cuda|torch` -> the family to build, a pure function of the request.

    `fast`: the architectures of the installed `cuda` family (None when it does not load);
    `device`: the torch device string. `auto` takes `cuda` on a CUDA device for an
    architecture it serves, one rank per replica; else `torch`, with the reason. A named
    family that cannot serve the request is a `ValueError` that says what would."""
    on_cuda = device.split(":", 1)[0] == "cuda"
    if requested not in RUNNER_CHOICES:
        raise ValueError(f"unknown --runner {requested!r} ({', '.join(RUNNER_CHOICES)})")
    if requested == "torch":
        return RunnerChoice("torch")
    why_not = _why_not_fast(on_cuda, device, model_type, fast, tensor_parallel)
    if why_not is None:
        return RunnerChoice("cuda")
    if requested == "cuda":
        raise ValueError(f"--runner cuda: {why_not}")
    return RunnerChoice("torch", f"the reference runner (torch): {why_not}")


def _why_not_fast(
    on_cuda: bool, device: str, model_type: str, fast: frozenset[str] | None, tp: int
) -> str | None:
    if not on_cuda:
        return f"the fast runner needs a CUDA device (--device cuda), this is {device!r}"
    if fast is None:
        return "the cuda runner family does not load here (is triton installed?)"
    if model_type not in fast:
        return f"the fast runner has no model for {model_type!r}; it serves " + ", ".join(
            sorted(fast)
        )
    if tp > 1:
        return "the fast runner has no tensor parallelism (--tensor-parallel 1)"
    return None


def fast_architectures() -> frozenset[str] | None:
    """The installed `cuda` family's architectures, or None when it does not load."""
    family = installed_families().families.get("cuda")
    return None if family is None else family.architectures
