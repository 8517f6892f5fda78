"""What load_state_dict recognises beside a plain state dict: checkpoint wrappers and key prefixes.

- **Wrappers.** An ultralytics checkpoint (``{"model": DetectionModel, "ema": ..., ...}``: the EMA weights where
  present, as ultralytics loads them), ``{"model": state_dict}``, ``{"state_dict": ...}``,
  ``{"model_state_dict": ...}``, and any object with a ``state_dict()`` method (a torch module), nested.
- **Prefixes.** Keys that are the model's names behind one common prefix (``module.`` of DataParallel,
  ``_orig_mod.`` of torch.compile, ``model.`` of a wrapper holding the DetectionModel as ``.model``), or
  with one common prefix of the names missing (``0.conv.weight`` of ``DetectionModel.model.state_dict()``),
  are renamed onto the names. Only where no key is a name already: a mapping that matches in part is
  reported as it is.

``normalize`` says what it did, so that an error about what is still missing names it.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

# The keys of the wrapping dicts, in the order they are tried ("ema" first: ultralytics loads the EMA weights).
WRAPPER_KEYS = ("ema", "model", "state_dict", "model_state_dict")


class IncompatibleKeys(NamedTuple):
    """What load_state_dict(strict=False) did not load, as torch's: names missing from the mapping, and
    keys of the mapping that are no name of the model."""

    missing_keys: list[str]
    unexpected_keys: list[str]


def _unwrap(value: Any) -> tuple[Any, list[str]]:
    steps: list[str] = []
    while True:  # wrappers nest a few levels (a checkpoint of a module of a state dict); each level is removed
        if not isinstance(value, Mapping) and callable(getattr(value, "state_dict", None)):
            value, step = value.state_dict(), "state_dict()"
        elif isinstance(value, Mapping):
            key = next((k for k in WRAPPER_KEYS if k in value and value[k] is not None
                        and (isinstance(value[k], Mapping) or callable(getattr(value[k], "state_dict", None)))), None)
            if key is None:
                break
            value, step = value[key], f"[{key!r}]"
        else:
            break
        steps.append(step)
    return value, steps


def _common(prefixes: list[str]) -> str | None:
    return Counter(prefixes).most_common(1)[0][0] if prefixes else None


def _dot_suffixes(name: str) -> list[tuple[str, str]]:
    """(prefix, suffix) at every dot of `name`, the prefix ending in the dot."""
    parts = name.split(".")
    return [(".".join(parts[:i]) + ".", ".".join(parts[i:])) for i in range(1, len(parts))]


def _rename(mapping: Mapping, names: Sequence[str]) -> tuple[dict, str | None]:
    expected = set(names)
    if any(key in expected for key in mapping):
        return dict(mapping), None
    keys = [key for key in mapping if isinstance(key, str)]
    # Per key, the shortest prefix behind which it is a name.
    stripped = _common([next(prefix for prefix, suffix in _dot_suffixes(key) if suffix in expected)
                        for key in keys if any(suffix in expected for _, suffix in _dot_suffixes(key))])
    if stripped is not None:
        return {key[len(stripped):] if isinstance(key, str) and key.startswith(stripped) else key: value
                for key, value in mapping.items()}, f"the prefix {stripped!r} stripped from the keys"
    added_by_suffix = {}
    for name in names:
        for prefix, suffix in _dot_suffixes(name):
            added_by_suffix.setdefault(suffix, prefix)
    added = _common([added_by_suffix[key] for key in keys if key in added_by_suffix])
    if added is not None:
        return {added + key if isinstance(key, str) else key: value for key, value in mapping.items()}, \
            f"the prefix {added!r} added to the keys"
    return dict(mapping), None


def normalize(value: Any, names: Sequence[str]) -> tuple[dict, str]:
    """`value` as a mapping onto `names`: unwrapped and its keys renamed where they need it (see above);
    and what was done, in words ("" when nothing)."""
    mapping, steps = _unwrap(value)
    if not isinstance(mapping, Mapping):
        return mapping, ""
    renamed, how = _rename(mapping, names)
    done = ([f"unwrapped {''.join(steps)}"] if steps else []) + ([how] if how else [])
    return renamed, "; ".join(done)


def unmatched(mapping: Mapping, names: Sequence[str], done: str) -> str:
    """Why no key of `mapping` is a name: its first keys beside the first names, and what was tried."""
    keys = ", ".join(repr(k) for k in list(mapping)[:3]) or "none"
    return (f"none of the mapping's {len(mapping)} keys is a name of the model (its first keys: {keys}; the model's "
            f"first names: {', '.join(repr(n) for n in names[:3])}); "
            + (f"after {done}" if done else "no checkpoint wrapper ({'ema'|'model'|'state_dict'|'model_state_dict': ...}"
               ", an object with state_dict()) or common key prefix was recognised"))
