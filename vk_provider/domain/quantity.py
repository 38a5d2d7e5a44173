"""Kubernetes resource quantities, parsed exactly: the one parser of the project.

``parse_quantity`` reads what the API accepts (``500m``, ``1.5Gi``, ``2``, ``1e3``, ``-1k``)
into an exact ``Decimal``; ``ceil_int`` and ``scaled_ceil`` round as kubelet does.

Invariants: pure; raises ``ValueError`` on anything that is not a quantity (never another
exception); never rounds while parsing.
"""

from __future__ import annotations

import re
from decimal import MAX_EMAX, MIN_EMIN, ROUND_CEILING, Decimal, Inexact, Rounded, localcontext
from typing import Final

# Kubernetes quantities are capped at int64; anything larger is refused rather than computed.
MAX_QUANTITY: Final = Decimal(2**63 - 1)
_INT32_MAX: Final = 2**31 - 1
GIB: Final = Decimal(2**30)

# <sign><number><suffix>; the suffix is a binary SI unit, a decimal SI unit or a decimal exponent.
# The exponent alternative comes first so that "1E3" is 1000 while a bare "1E" is one exa.
_QUANTITY: Final = re.compile(
    r"(?P<sign>[+-]?)(?P<number>[0-9]+(?:\.[0-9]*)?|\.[0-9]+)"
    r"(?P<suffix>[eE][+-]?[0-9]+|[KMGTPE]i|[numkMGTPE])?"
)
_BINARY_SUFFIXES: Final = {"Ki": 1, "Mi": 2, "Gi": 3, "Ti": 4, "Pi": 5, "Ei": 6}
_DECIMAL_SUFFIXES: Final = {
    "n": -9,
    "u": -6,
    "m": -3,
    "": 0,
    "k": 3,
    "M": 6,
    "G": 9,
    "T": 12,
    "P": 15,
    "E": 18,
}


def parse_quantity(text: str) -> Decimal:
    """Parse a Kubernetes resource quantity exactly (``500m``, ``1.5Gi``, ``2``, ``1e3``, ``-1k``).

    Accepts binary SI suffixes (Ki … Ei), decimal SI suffixes (n u m k M G T P E) and decimal
    exponents (``e``/``E`` followed by a signed integer in int32 range, as Kubernetes parses it).
    Raises ``ValueError`` on anything else, including the empty string and whitespace.
    """
    if not isinstance(text, str):
        raise ValueError(f"a quantity must be a string, not {type(text).__name__}")
    match = _QUANTITY.fullmatch(text)
    if match is None:
        raise ValueError(f"{text!r} is not a quantity (examples: 500m, 2, 1.5Gi, 40G, 1e3)")
    sign = "-" if match["sign"] == "-" else ""
    number = match["number"]
    suffix = match["suffix"] or ""
    if suffix in _BINARY_SUFFIXES:
        # Exact: the precision covers every digit of the number times 2**60.
        with localcontext() as ctx:
            ctx.prec = len(number) + 25
            ctx.Emin, ctx.Emax = MIN_EMIN, MAX_EMAX
            ctx.traps[Inexact] = True
            ctx.traps[Rounded] = True
            return Decimal(sign + number) * (1 << (10 * _BINARY_SUFFIXES[suffix]))
    if suffix in _DECIMAL_SUFFIXES:
        exponent = _DECIMAL_SUFFIXES[suffix]
    else:
        exponent = int(suffix[1:])
        if abs(exponent) > _INT32_MAX:
            raise ValueError(f"{text!r} is not a quantity: the exponent is out of range")
    # Building from a string is exact whatever the decimal context says.
    return Decimal(f"{sign}{number}e{exponent}")


def ceil_int(value: Decimal) -> int:
    """The smallest integer >= ``value``; the caller has bounded ``value``."""
    return int(value.to_integral_value(rounding=ROUND_CEILING))


def scaled_ceil(value: Decimal, power_of_ten: int) -> int:
    """``ceil(value * 10**power_of_ten)``, exactly, for a bounded ``value``."""
    sign, digits, exponent = value.as_tuple()
    assert isinstance(exponent, int)  # bounded quantities are finite
    return ceil_int(Decimal((sign, digits, exponent + power_of_ten)))
