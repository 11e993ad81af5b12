"""Idefics3 and SmolVLM (SmolVLM2).

An image is resized, split into ``rows x cols`` tiles of the tower's size plus a global image;
the placeholder (``<image>``) expands to, per tile, ``<fake_token_around_image><row_r_col_c>`` and
``image_seq_len`` image tokens, a newline per row, then the global image framed the same way.
The processor puts a prompt's tiles on axis 1 (one sample) and pads samples to the most tiles
with all-zero tiles, which the tower drops; each tile is encoded on its own, so the tiles of
several images join on axis 1 exactly. The pixel attention mask follows the tiles.
"""

from __future__ import annotations

from visioncache.integrations.transformers.families.description import Family

__all__ = ["IDEFICS3", "SMOLVLM"]


IDEFICS3 = Family("idefics3", encoder_inputs=("pixel_values", "pixel_attention_mask"), batch_dim=1)
SMOLVLM = Family("smolvlm", encoder_inputs=("pixel_values", "pixel_attention_mask"), batch_dim=1)
