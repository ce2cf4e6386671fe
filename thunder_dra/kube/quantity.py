"""Kubernetes resource quantities ("500m", "1Gi", "2e3") as exact decimals.

The grammar of apimachinery's ``resource.Quantity``: a signed decimal number, then an
optional suffix: a binary SI one (Ki Mi Gi Ti Pi Ei), a decimal SI one (n u m "" k M G
T P E), or a decimal exponent (e3, E-2).
"""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation
from typing import Final

_BINARY: Final = {"Ki": 1, "Mi": 2, "Gi": 3, "Ti": 4, "Pi": 5, "Ei": 6}
_DECIMAL: Final = {
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
_QUANTITY: Final = re.compile(
    r"(?P<number>[+-]?(?:\d+\.?\d*|\.\d+))"
    r"(?P<suffix>Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE]|[eE][+-]?\d+)?"
)


def parse_quantity(value: str | int | float | Decimal) -> Decimal:
    """The value of a quantity; ``ValueError`` naming the value if it is not one."""
    if isinstance(value, bool):
        raise ValueError(f"not a quantity: {value!r}")
    if isinstance(value, int | Decimal):
        return Decimal(value)
    if isinstance(value, float):
        return Decimal(str(value))
    if not isinstance(value, str):
        raise ValueError(f"not a quantity: {value!r}")
    match = _QUANTITY.fullmatch(value.strip())
    if match is None:
        raise ValueError(f"not a quantity: {value!r}")
    try:
        number = Decimal(match["number"])
    except InvalidOperation:
        raise ValueError(f"not a quantity: {value!r}") from None
    suffix = match["suffix"] or ""
    if suffix in _BINARY:
        return number * (Decimal(1024) ** _BINARY[suffix])
    if suffix in _DECIMAL:
        return number.scaleb(_DECIMAL[suffix])
    return number.scaleb(int(suffix[1:]))
