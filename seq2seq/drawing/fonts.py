"""The fonts a figure's text needs: DejaVu Sans (matplotlib's), then the installed fonts that
cover the characters it lacks, and a warning naming those none covers."""

from __future__ import annotations

import functools
import warnings
from collections.abc import Sequence

from matplotlib import font_manager
from matplotlib.ft2font import FT2Font

# Tried in order for characters DejaVu Sans lacks (Debian: fonts-noto-cjk, fonts-noto-core).
_FALLBACK_FONTS = (
    "Noto Sans CJK SC",
    "Noto Sans CJK JP",
    "Noto Sans",
    "Noto Sans Arabic",
    "Noto Sans Devanagari",
    "Noto Sans Hebrew",
    "Noto Sans Thai",
)


@functools.cache
def _font_chars(family: str) -> frozenset[int] | None:
    """Code points the installed font ``family`` covers, or None if it is not installed."""
    try:
        path = font_manager.findfont(
            font_manager.FontProperties(family=family), fallback_to_default=False
        )
    except ValueError:
        return None
    return frozenset(FT2Font(path).get_charmap())


def font_families(tokens: Sequence[str]) -> list[str]:
    """Font families that together cover the tokens' characters, DejaVu Sans first.

    Warns naming the characters no installed font covers; those draw as empty boxes.
    """
    missing = {ord(c) for t in tokens for c in t if not c.isspace()}
    missing -= _font_chars("DejaVu Sans") or frozenset()  # matplotlib ships DejaVu Sans
    families = ["DejaVu Sans"]
    for family in _FALLBACK_FONTS:
        if not missing:
            break
        covered = _font_chars(family)
        if covered is not None and missing & covered:
            families.append(family)
            missing -= covered
    if missing:
        chars = "".join(chr(c) for c in sorted(missing))
        warnings.warn(
            f"no installed font has glyphs for {chars!r}; they will draw as boxes. "
            "Install a font that covers them (Debian: fonts-noto-cjk, fonts-noto-core); "
            "if it is installed, delete matplotlib's font cache (~/.cache/matplotlib).",
            stacklevel=3,  # the caller of plot_attention
        )
    return families
