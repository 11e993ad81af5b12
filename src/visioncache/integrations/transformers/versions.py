"""The transformers releases the family descriptions were tested against, checked at import.

Why a range and not one pin: the descriptions use transformers' processor seam
(``_process_images``, ``replace_image_token``, ``get_text_with_replacements``,
``create_mm_token_type_ids``) and ``mm_encoder_outputs``, which every 5.x release since
``MIN_TRANSFORMERS`` has; the family suite passed on each release of ``TESTED_TRANSFORMERS``.
A release below the minimum (or another major) lacks that seam and is refused. A newer 5.x
release is allowed with an `UntestedVersionWarning`: the load-time check (``exactness.py``)
still proves each family on the loaded model, and refuses it if that release changed it.
"""

from __future__ import annotations

from visioncache.versions import UntestedVersionWarning, require_version

__all__ = [
    "MAX_TESTED_TRANSFORMERS",
    "MIN_TRANSFORMERS",
    "TESTED_TRANSFORMERS",
    "UntestedVersionWarning",
    "check_transformers_version",
]

MIN_TRANSFORMERS = "5.20.0"
# Each release the family suite (tests/integrations/test_transformers_families.py) passed on.
TESTED_TRANSFORMERS = ("5.20.2", "5.21.1", "5.22.2", "5.23.0", "5.24.0", "5.25.0")
MAX_TESTED_TRANSFORMERS = TESTED_TRANSFORMERS[-1]


def check_transformers_version(version: str | None = None) -> None:
    """Refuse a transformers release outside ``MIN_TRANSFORMERS`` .. 6 (`visioncache.versions`:
    `UnsupportedVersionError`, an ImportError); warn for one newer than every tested release.
    ``version`` defaults to the installed one."""
    require_version(
        "transformers",
        f">={MIN_TRANSFORMERS},<6",
        needed_by="visioncache's transformers integration",
        installed=version,
        tested=TESTED_TRANSFORMERS,
        why="older releases lack the processor seam and mm_encoder_outputs it uses; each model is "
        "still checked when CachedVisionModel is built",
        extra="hf",
    )
