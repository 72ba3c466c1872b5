"""The valid range of each pruning parameter, stated once: sparsity, p, θ and T.

Every boundary where one of these values enters the library — the
``Pruner``'s settings (its ``PrunerConfig``), :func:`feather_sparse.ops.threshold`,
the training config read from a recipe or the command line — calls the
function here, so the rule and its message are the same everywhere. Nothing
on a hot path calls them.

- **sparsity** ``S ∈ [0, 1)``: the fraction of prunable weights set to zero;
  ``S = 1`` would leave a model without weights.
- **p** ``∈ [1, ∞]``: Feather's operator ``P_T(w) = sign(w)(|w|^p − T^p)^(1/p)``
  is, in the paper's words (§2.2.1), a family *between* soft (``p = 1``) and
  hard (``p = ∞``) thresholding. For ``p ≥ 1`` the shrinkage of a kept
  weight, ``|w| − |P_T(w)|``, is largest (``T``) at ``p = 1`` and falls toward
  0 as ``|w|`` grows (about ``T^p / (p·|w|^(p−1))``). For ``p < 1`` it grows
  without bound, like ``T^p·|w|^(1−p) / p``: the large weights move furthest
  from their dense values — more bias than soft thresholding, the opposite of
  what the family is for. The operator is still defined there, but no setting
  of the paper lives there, so the library refuses it.
- **θ** ``∈ [0, 1]``: the gradient scale of pruned weights (§2.2.2); 0 is the
  non-STE variant, 1 the plain STE.
- **T** ``∈ [0, ∞)``: a threshold is a magnitude. A negative one prunes
  nothing and, for finite ``p``, enlarges every weight (at ``T = −0.5``,
  ``p = 3``: 0.1 becomes 0.501); NaN or ``∞`` make the outputs NaN.
"""

from __future__ import annotations

import math
import numbers
from typing import Any

__all__ = ["check_p", "check_sparsity", "check_theta", "check_threshold"]


def _number(name: str, value: Any, expected: str) -> float:
    # numbers.Real: NumPy's scalars too (np.float32(0.9) from a config array).
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ValueError(f"{name} must be a number {expected}, got {value!r}")
    return float(value)


def as_int(value: Any) -> int | None:
    """``value`` as a Python int if it is an integer (NumPy's ``np.int64`` too), else None.

    A bool is not an integer here: ``True`` steps is a slip, not 1.
    """
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        return None
    return int(value)


def check_sparsity(value: Any, name: str = "sparsity") -> float:
    """``value`` as a float if it is a valid target sparsity ``S ∈ [0, 1)``.

    Args:
        value: the sparsity given.
        name: the name to give it in the error message.

    Raises:
        ValueError: naming ``name``, the range and an example.
    """
    s = _number(name, value, "in [0, 1)")
    if not 0.0 <= s < 1.0:  # also rejects NaN
        raise ValueError(f"{name} must be in [0, 1) (e.g. 0.9 keeps 10 % of the weights), got {s}")
    return s


def check_p(value: Any) -> float:
    """``value`` as a float if it is a valid operator power ``p ∈ [1, ∞]``.

    Args:
        value: the ``p`` given.

    Raises:
        ValueError: for ``p < 1``, NaN or a non-number, naming the fix.
    """
    p = _number("p", value, ">= 1")
    if not p >= 1.0:  # also rejects NaN
        raise ValueError(
            f"p must be >= 1 (1 = soft, 3 = Feather, inf = hard; below 1 the operator shrinks "
            f"large weights more than soft thresholding does), got {p}"
        )
    return p


def check_theta(value: Any, allow_auto: bool = False) -> Any:
    """``value`` as a float if it is a valid gradient scale ``θ ∈ [0, 1]``.

    Args:
        value: the θ given.
        allow_auto: also accept ``"auto"`` (the paper's automatic rule), returned as is.

    Raises:
        ValueError: naming the range and what its ends mean.
    """
    if allow_auto and isinstance(value, str) and value.strip().lower() == "auto":
        return "auto"  # as --method and --pattern read: " Auto" is auto
    auto = " or 'auto'" if allow_auto else ""  # offered only where it is accepted
    if isinstance(value, str):
        raise ValueError(f"theta must be a number in [0, 1]{auto}, got {value!r}")
    theta = _number("theta", value, "in [0, 1]")
    if not 0.0 <= theta <= 1.0:  # also rejects NaN
        raise ValueError(f"theta must be in [0, 1] (1 = plain STE, 0 = non-STE){auto}, got {theta}")
    return theta


def check_threshold(value: float) -> float:
    """``value`` if it is a valid threshold ``T``: a finite magnitude ``>= 0``.

    Args:
        value: the threshold given.

    Raises:
        ValueError: for a negative, NaN or infinite ``T``, saying what it would do.
    """
    if math.isnan(value) or math.isinf(value):
        raise ValueError(
            f"the threshold T must be a finite number >= 0, got {value} (it would make every "
            "output NaN); check the computation that produced it"
        )
    if value < 0:
        raise ValueError(
            f"the threshold T must be >= 0, got {value}: a negative T enlarges the weights "
            "instead of pruning them; pass its magnitude"
        )
    return value
