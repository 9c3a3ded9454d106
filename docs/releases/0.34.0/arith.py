"""Integer arithmetic shared by the reference's modules."""

from __future__ import annotations


def cdiv(a: int, b: int) -> int:
    """``ceil(a / b)`` in integers: the pages of ``b`` tokens that ``a`` tokens fill."""
    return -(-a // b)
