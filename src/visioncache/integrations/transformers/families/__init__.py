"""Model family descriptions for the transformers integration (one module per family group)."""

from visioncache.integrations.transformers.families.description import (
    Family,
    VideoDescription,
    process_images,
    split_rows,
)
from visioncache.integrations.transformers.families.registry import FAMILIES, family_for

__all__ = ["FAMILIES", "Family", "VideoDescription", "family_for", "process_images", "split_rows"]
