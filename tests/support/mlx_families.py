"""Tiny random-weight checkpoints of the mlx-vlm families beyond Qwen2-VL / Qwen2.5-VL, as model
directories mlx-vlm (and so vllm-mlx's server) loads like downloaded ones.

Why: every family visioncache serves is proven on the real engine, and no weights can be
downloaded. Each `TinyFamily` (the Qwen families here, the others in
`tests.support.mlx_idefics3_families` and `tests.support.mlx_gemma_families`) states a family's
tiny configuration, its special tokens (a word-level tokenizer over them and `WORDS`) and a chat
template with the family's image marker; `save_family_dir` writes ``config.json``,
``model.safetensors`` (random weights, mlx layout), the tokenizer and the processor files, which
``mlx_vlm.load`` reads back with the family's real processor class.
"""

from __future__ import annotations

import importlib
import json
from pathlib import Path
from typing import Any

from tests.support.mlx_gemma_families import GEMMA_FAMILIES
from tests.support.mlx_idefics3_families import IDEFICS3_FAMILIES
from tests.support.mlx_llava_families import LLAVA_FAMILIES
from tests.support.mlx_tiny_family import TINY_TEXT, TinyFamily
from visioncache.bench.vocabulary import WORDS
from visioncache.integrations.mlx_vlm.imports import import_mlx, import_mlx_vlm_utils

__all__ = ["TINY_FAMILIES", "TinyFamily", "media_token_bias", "save_family_dir"]

# The Qwen2-VL template's layout, shared by the Qwen families (their real templates add tool and
# thinking blocks that change nothing about images).
QWEN_CHAT_TEMPLATE = (
    "{% for message in messages %}{% if loop.first and message['role'] != 'system' %}"
    "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n{% endif %}"
    "<|im_start|>{{ message['role'] }}\n{% if message['content'] is string %}"
    "{{ message['content'] }}<|im_end|>\n{% else %}{% for content in message['content'] %}"
    "{% if content['type'] == 'image' or 'image' in content or 'image_url' in content %}"
    "<|vision_start|><|image_pad|><|vision_end|>"
    "{% elif 'text' in content %}{{ content['text'] }}{% endif %}{% endfor %}<|im_end|>\n"
    "{% endif %}{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
QWEN_MEDIA_TOKENS = ("<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>")
QWEN_TOKENS = (
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|image_pad|>",
    "<|video_pad|>",
)


def _qwen3_vl_config(ids: dict[str, int], vocab: int) -> dict[str, Any]:
    text = {
        "model_type": "qwen3_vl",
        **TINY_TEXT,
        "rms_norm_eps": 1e-6,
        "vocab_size": vocab,
        "rope_theta": 10000.0,
        "max_position_embeddings": 4096,
        "rope_scaling": {"rope_type": "default", "mrope_section": [4, 2, 2], "mrope_interleaved": True},
        "tie_word_embeddings": False,
    }
    vision = {
        "model_type": "qwen3_vl",
        "depth": 2,
        "hidden_size": 32,
        "intermediate_size": 64,
        "out_hidden_size": 64,
        "num_heads": 2,
        "patch_size": 16,
        "spatial_merge_size": 2,
        "temporal_patch_size": 2,
        "num_position_embeddings": 64,
        "deepstack_visual_indexes": [0, 1],
    }
    return {
        "model_type": "qwen3_vl",
        "image_token_id": ids["<|image_pad|>"],
        "video_token_id": ids["<|video_pad|>"],
        "vision_start_token_id": ids["<|vision_start|>"],
        "vision_end_token_id": ids["<|vision_end|>"],
        "vocab_size": vocab,
        "eos_token_id": ids["<|im_end|>"],
        "text_config": text,
        "vision_config": vision,
    }


def _qwen3_5_config(ids: dict[str, int], vocab: int) -> dict[str, Any]:
    """Qwen3.5: gated-delta (linear attention) layers with a full-attention layer every 2nd."""
    text = {
        "model_type": "qwen3_5",
        "hidden_size": 64,
        "num_hidden_layers": 4,
        "intermediate_size": 128,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 32,
        "linear_num_value_heads": 2,
        "linear_num_key_heads": 2,
        "linear_key_head_dim": 16,
        "linear_value_head_dim": 16,
        "linear_conv_kernel_dim": 4,
        "full_attention_interval": 2,
        "rms_norm_eps": 1e-6,
        "vocab_size": vocab,
        "max_position_embeddings": 4096,
        "rope_parameters": {
            "type": "default",
            "mrope_section": [2, 1, 1],
            "rope_theta": 10000.0,
            "partial_rotary_factor": 0.25,
        },
        "tie_word_embeddings": False,
    }
    vision = {
        "model_type": "qwen3_5",
        "depth": 2,
        "hidden_size": 32,
        "intermediate_size": 64,
        "out_hidden_size": 64,
        "num_heads": 2,
        "patch_size": 16,
        "spatial_merge_size": 2,
        "temporal_patch_size": 2,
        "num_position_embeddings": 64,
    }
    return {
        **_qwen3_vl_config(ids, vocab),
        "model_type": "qwen3_5",
        "text_config": text,
        "vision_config": vision,
    }


_QWEN3_PREPROCESSOR = {
    "image_processor_type": "Qwen2VLImageProcessor",
    "patch_size": 16,
    "temporal_patch_size": 2,
    "merge_size": 2,
    "min_pixels": 32 * 32,
    "max_pixels": 160 * 160,
    "image_mean": [0.5, 0.5, 0.5],
    "image_std": [0.5, 0.5, 0.5],
}

TINY_FAMILIES: dict[str, TinyFamily] = {
    "qwen3_vl": TinyFamily(
        model_type="qwen3_vl",
        special_tokens=QWEN_TOKENS,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        chat_template=QWEN_CHAT_TEMPLATE,
        config=_qwen3_vl_config,
        files={"preprocessor_config.json": {**_QWEN3_PREPROCESSOR, "processor_class": "Qwen3VLProcessor"}},
        stop_tokens=("<|endoftext|>",),
        media_tokens=QWEN_MEDIA_TOKENS,
    ),
    "qwen3_5": TinyFamily(
        model_type="qwen3_5",
        special_tokens=QWEN_TOKENS,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        chat_template=QWEN_CHAT_TEMPLATE,
        config=_qwen3_5_config,
        files={"preprocessor_config.json": {**_QWEN3_PREPROCESSOR, "processor_class": "Qwen3VLProcessor"}},
        stop_tokens=("<|endoftext|>",),
        media_tokens=QWEN_MEDIA_TOKENS,
    ),
    **IDEFICS3_FAMILIES,
    **GEMMA_FAMILIES,
    **LLAVA_FAMILIES,
}


def _tokenizer(family: TinyFamily) -> Any:
    """A byte-level BPE tokenizer over `WORDS` (whole words are tokens) and the family's special
    tokens. Byte-level BPE, as the families' real tokenizers, because transformers rebuilds some
    families' tokenizers from the vocabulary and merges alone (Qwen3.5's), with its own
    pre-tokenizer: a word-level vocabulary would not survive that."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    transformers: Any = importlib.import_module("transformers")
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=1000,
        special_tokens=list(family.special_tokens),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    bpe.train_from_iterator([" ".join(WORDS)] * 3 + [f" {word}" for word in WORDS] + list(WORDS), trainer)
    tokenizer = transformers.PreTrainedTokenizerFast(
        tokenizer_object=bpe,
        eos_token=family.eos_token,
        pad_token=family.pad_token,
        bos_token=family.bos_token,
        extra_special_tokens=dict(family.tokenizer_attributes),
    )
    # Special tokens are matched before pre-tokenizing, as with the families' real tokenizers.
    tokenizer.add_special_tokens({"additional_special_tokens": list(family.special_tokens)})
    tokenizer.chat_template = family.chat_template
    return tokenizer


def save_family_dir(directory: str | Path, model_type: str, *, seed: int = 0) -> Path:
    """Write the tiny random-weight ``model_type`` checkpoint (float32) into ``directory``."""
    from mlx.utils import tree_flatten

    mx, utils = import_mlx(), import_mlx_vlm_utils()
    family = TINY_FAMILIES[model_type]
    path = Path(directory)
    path.mkdir(parents=True, exist_ok=True)
    tokenizer = _tokenizer(family)
    tokenizer.save_pretrained(path)
    (path / "chat_template.jinja").write_text(family.chat_template)  # where processors look for it
    ids = {token: tokenizer.convert_tokens_to_ids(token) for token in family.special_tokens}
    config = family.config(ids, len(tokenizer))
    stops = [ids[family.eos_token], *(ids[token] for token in family.stop_tokens)]
    config.setdefault("eos_token_id", stops if len(stops) > 1 else stops[0])
    (path / "config.json").write_text(json.dumps(config, indent=2))
    for name, contents in family.files.items():
        (path / name).write_text(json.dumps(contents, indent=2))
    module = importlib.import_module(f"mlx_vlm.models.{model_type}")
    model_config = module.ModelConfig.from_dict(dict(config))
    model_config = utils.update_module_configs(model_config, module, config, ["text", "vision"])
    mx.random.seed(seed)
    model = module.Model(model_config)
    weights = dict(tree_flatten(model.parameters()))
    mx.save_safetensors(str(path / "model.safetensors"), weights, metadata={"format": "mlx"})
    return path


def media_token_bias(model_dir: str | Path) -> dict[str, float]:
    """An OpenAI ``logit_bias`` that keeps the model in ``model_dir`` from writing image markers."""
    config = json.loads((Path(model_dir) / "config.json").read_text())
    family = TINY_FAMILIES.get(config["model_type"])
    tokens = family.media_tokens if family is not None else QWEN_MEDIA_TOKENS
    vocabulary = json.loads((Path(model_dir) / "tokenizer.json").read_text())["model"]["vocab"]
    return {str(vocabulary[token]): -100.0 for token in tokens}
