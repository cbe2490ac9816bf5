"""The model-size ladder of a study (``ladder:`` in a study file; docs/scale.md): its rung param, its reference
arm, and rungs that grow in parameters."""

from __future__ import annotations

from typing import Callable, Sequence

from omegaconf import DictConfig

from foundation.errors import ConfigError

LADDER_AXES = ("parameters", "n_over_k")  # ladder.axis (sweeps.spec.schema.LadderSpec)


def check_ladder(spec: DictConfig, arms: Sequence[str], config_of: Callable[[dict], DictConfig]) -> None:
    """``ladder``: a categorical arm param of a grid with at least 2 rungs that grow in parameters, and a
    reference arm named by a choice of every other arm param. ``config_of``: a trial's params -> its config."""
    if spec.ladder.axis not in LADDER_AXES:
        raise ConfigError(f"ladder.axis: {spec.ladder.axis!r} is not one of {', '.join(LADDER_AXES)}")
    if spec.ladder.claim is not None and (not isinstance(spec.ladder.claim, str) or "\n" in spec.ladder.claim):
        raise ConfigError("ladder.claim: one sentence (the published answer the report states beside the lab's)")
    others = _check_rung(spec, arms)
    _check_reference(spec, others)
    _check_growth(spec, config_of)


def _check_rung(spec: DictConfig, arms: Sequence[str]) -> list[str]:
    """The rung param is a categorical arm param of a grid with >= 2 choices; returns the other arm params."""
    ladder = spec.ladder
    if spec.sampler.kind != "grid":
        raise ConfigError(f"ladder: a ladder is a grid (every rung × arm × seed); sampler.kind is {spec.sampler.kind}")
    if ladder.rung not in spec.space:
        raise ConfigError(f"ladder.rung: {ladder.rung!r} is not a param of space (has: {', '.join(spec.space)})")
    p = spec.space[ladder.rung]
    if p.type != "categorical" or len(p.choices) < 2 or p.when:
        raise ConfigError(
            f"ladder.rung: space.{ladder.rung} must be a categorical param with at least 2 choices "
            "(the model sizes, smallest first) and no 'when'"
        )
    if ladder.rung not in arms:
        raise ConfigError(f"ladder.rung: {ladder.rung!r} must be one of arms ({', '.join(arms)})")
    others = [a for a in arms if a != ladder.rung]
    if not others:
        raise ConfigError(
            f"ladder: arms has no param beside the rung {ladder.rung!r}; add the param whose choices "
            "are the arms compared at each rung (e.g. arm: {full: ..., linformer: ...})"
        )
    return others


def _check_reference(spec: DictConfig, others: Sequence[str]) -> None:
    """The reference names a choice of every arm param beside the rung, and is not the only arm."""
    ladder = spec.ladder
    for key in ladder.reference:
        if key not in others:
            raise ConfigError(
                f"ladder.reference.{key}: not an arm param beside the rung (arm params: {', '.join(others)})"
            )
    for name in others:
        choices = [str(c) for c in spec.space[name].choices] if spec.space[name].type == "categorical" else []
        if name not in ladder.reference:
            raise ConfigError(
                f"ladder.reference: give the reference arm's value of {name!r}"
                + (f" (choices: {', '.join(choices)})" if choices else "")
            )
        if str(ladder.reference[name]) not in choices:
            raise ConfigError(
                f"ladder.reference.{name}: {ladder.reference[name]!r} is not a choice of space.{name} "
                f"(choices: {', '.join(choices) or 'none: a ladder arm param must be categorical'})"
            )
    if all(len(spec.space[name].choices) == 1 for name in others):
        raise ConfigError("ladder.reference: the reference is the only arm; add the arms to compare with it")


def _check_growth(spec: DictConfig, config_of: Callable[[dict], DictConfig]) -> None:
    """The reference's parameters (``ladder.axis: n_over_k``: its sequence length n) grow from rung to rung,
    smallest first."""
    from training.train import model_parameters  # builds the model on the meta device: no memory, no data

    ladder, sizes = spec.ladder, []
    by_length = ladder.axis == "n_over_k"
    unit = "positions (n)" if by_length else "parameters"
    for rung in spec.space[ladder.rung].choices:
        chosen = {ladder.rung: rung, **ladder.reference}
        try:  # the params in space order, as a trial applies them
            cfg = config_of({n: chosen[n] for n in spec.space if n in chosen})
            sizes.append((str(rung), cfg.model.max_len if by_length else model_parameters(cfg)))
        except ConfigError as err:
            raise ConfigError(f"ladder: rung {rung}: {err}") from None
    for (small, n_small), (large, n_large) in zip(sizes, sizes[1:]):
        if n_large <= n_small:
            raise ConfigError(
                f"ladder.rung: rungs must grow, smallest first: {large!r} has {n_large:,} {unit}, "
                f"not more than {small!r} before it ({n_small:,})"
            )
