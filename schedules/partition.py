"""How a model's layers are split into pipeline stages: one rule for the simulator and the runtime."""

from __future__ import annotations

from collections.abc import Sequence

from common.errors import ConfigError, quote

__all__ = ["split_layers", "stage_ranges"]


def split_layers(
    num_layers: int,
    num_stages: int,
    split: Sequence[int] | None = None,
    *,
    min_per_stage: int = 1,
    field: str = "split",
    layers: str = "layers",
    fix: str | None = None,
) -> tuple[int, ...]:
    """Layers per stage: ``split`` checked, or as even as possible with the extra layers on the first stages.

    The last stages get fewer layers first: in a transformer the last stage
    also runs the head. ``field`` names the setting in errors, ``layers`` says
    what the model's layers are, ``fix`` what to do when there are fewer layers than stages.
    """
    if split is not None:
        sizes = tuple(split)
        if not all(isinstance(x, int) and not isinstance(x, bool) for x in sizes):
            raise ConfigError(f"{field} {quote(list(sizes))}: layer counts must be integers", field=field)
        if len(sizes) != num_stages or sum(sizes) != num_layers or min(sizes, default=0) < min_per_stage:
            raise ConfigError(
                f"{field} {','.join(map(str, sizes))} must give each of the {num_stages} stages "
                f">= {min_per_stage} layer{'s' * (min_per_stage != 1)} and sum to the model's {num_layers} {layers}",
                field=field,
            )
        return sizes
    if num_stages > num_layers:
        fix = fix or f"use at most {num_layers} stages or a model with at least {num_stages} layers"
        raise ConfigError(f"{num_stages} stages but the model has {num_layers} {layers}; {fix}", field="layers")
    base, extra = divmod(num_layers, num_stages)
    return tuple(base + (1 if s < extra else 0) for s in range(num_stages))


def stage_ranges(sizes: Sequence[int]) -> tuple[range, ...]:
    """Contiguous layer index ranges, one per stage, from layers per stage."""
    ranges, start = [], 0
    for n in sizes:
        ranges.append(range(start, start + n))
        start += n
    return tuple(ranges)
