"""How the pages count things in words: "1 run", "2 runs" (the sidebar said "1 runs", issue 52)."""

from __future__ import annotations


def counted(n: int, noun: str, nouns: str | None = None) -> str:
    """`n` and the noun in its number: counted(1, "run") is "1 run", counted(3, "run") "3 runs" (`nouns`: an irregular plural)."""
    return f"{n} {noun if n == 1 else (nouns or noun + 's')}"
