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

import warnings
from importlib import metadata

from packaging.version import Version

__all__ = [
    "MAX_TESTED_TRANSFORMERS",
    "MIN_TRANSFORMERS",
    "TESTED_TRANSFORMERS",
    "UntestedVersionWarning",
    "check_transformers_version",
]

MIN_TRANSFORMERS = "5.20.0"
MAX_TESTED_TRANSFORMERS = "5.24.0"
# Each release the family suite (tests/integrations/test_transformers_families.py) passed on.
TESTED_TRANSFORMERS = ("5.20.2", "5.21.1", "5.22.2", "5.23.0", "5.24.0")


class UntestedVersionWarning(UserWarning):
    """transformers is newer than any release visioncache's family descriptions were tested on."""


def check_transformers_version(version: str | None = None) -> None:
    """Raise ImportError for a transformers release outside ``MIN_TRANSFORMERS`` .. 6; warn for
    one newer than ``MAX_TESTED_TRANSFORMERS``. ``version`` defaults to the installed one."""
    installed = version if version is not None else metadata.version("transformers")
    parsed = Version(installed)
    if parsed < Version(MIN_TRANSFORMERS) or parsed.major != Version(MIN_TRANSFORMERS).major:
        raise ImportError(
            f"visioncache's transformers integration needs transformers >= {MIN_TRANSFORMERS}, < 6 "
            f"(tested: {', '.join(TESTED_TRANSFORMERS)}); {installed} is installed: "
            f"pip install 'transformers>={MIN_TRANSFORMERS},<6'"
        )
    if parsed.release > Version(MAX_TESTED_TRANSFORMERS).release:
        warnings.warn(
            f"transformers {installed} is newer than the releases visioncache's family descriptions "
            f"were tested on ({MIN_TRANSFORMERS} .. {MAX_TESTED_TRANSFORMERS}); each model is still "
            "checked when CachedVisionModel is built",
            UntestedVersionWarning,
            stacklevel=3,
        )
