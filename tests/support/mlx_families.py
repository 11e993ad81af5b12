"""Tiny random-weight checkpoints of the mlx-vlm families beyond Qwen2-VL / Qwen2.5-VL, as model
directories mlx-vlm (and so vllm-mlx's server) loads like downloaded ones.

Why: every family visioncache serves is proven on the real engine, and no weights can be
downloaded. Each `TinyFamily` states a family's tiny configuration, its special tokens (a
word-level tokenizer over them and `WORDS`) and a chat template with the family's image marker;
`save_family_dir` writes ``config.json``, ``model.safetensors`` (random weights, mlx layout), the
tokenizer and the processor files, which ``mlx_vlm.load`` reads back with the family's real
processor class.
"""

from __future__ import annotations

import importlib
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

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


def _gemma_template(image_marker: str, bos: str, start: str, end: str, model_role: str) -> str:
    return (
        f"{{{{ {bos!r} }}}}{{% for message in messages %}}{start}"
        f"{{{{ {model_role!r} if message['role'] == 'assistant' else message['role'] }}}}\n"
        "{% if message['content'] is string %}{{ message['content'] }}{% else %}"
        "{% for item in message['content'] %}"
        f"{{% if item['type'] == 'image' or 'image_url' in item %}}{image_marker}"
        "{% elif item['type'] == 'text' %}{{ item['text'] }}{% endif %}{% endfor %}{% endif %}"
        f"{end}\n{{% endfor %}}{{% if add_generation_prompt %}}{start}{model_role}\n{{% endif %}}"
    )


@dataclass(frozen=True)
class TinyFamily:
    """One family's tiny checkpoint: its tokens, template, configuration and processor files."""

    model_type: str
    special_tokens: tuple[str, ...]  # added as special tokens, in this order (ids from 0)
    eos_token: str
    pad_token: str
    chat_template: str
    config: Callable[[dict[str, int], int], dict[str, Any]]  # (token ids, vocab size) -> config.json
    files: dict[str, dict[str, Any]]  # other JSON files (preprocessor_config.json, ...)
    bos_token: str | None = None
    stop_tokens: tuple[str, ...] = ()  # generation stops on these (and eos)
    tokenizer_attributes: dict[str, str] = field(default_factory=dict)  # extra_special_tokens
    # Tokens that mark images in a prompt: a random model that writes one into its answer makes
    # the next turn's history hold one placeholder too many (stock vllm-mlx then fails it too).
    media_tokens: tuple[str, ...] = ()


def _qwen3_vl_config(ids: dict[str, int], vocab: int) -> dict[str, Any]:
    text = {
        "model_type": "qwen3_vl",
        "hidden_size": 64,
        "num_hidden_layers": 2,
        "intermediate_size": 128,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 16,
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

_IDEFICS3_TOKENS = (
    "<|endoftext|>",
    "<|im_start|>",
    "<end_of_utterance>",
    "<fake_token_around_image>",
    "<image>",
    "<global-img>",
    *(f"<row_{row}_col_{col}>" for row in (1, 2) for col in (1, 2)),
)
# SmolVLM's template: "User:<image> describe<end_of_utterance>\nAssistant:".
_IDEFICS3_TEMPLATE = (
    "<|im_start|>{% for message in messages %}{{ message['role'] | capitalize }}:"
    "{% if message['content'] is string %} {{ message['content'] }}{% else %}"
    "{% for item in message['content'] %}{% if item['type'] == 'image' or 'image_url' in item %}<image>"
    "{% elif item['type'] == 'text' %} {{ item['text'] }}{% endif %}{% endfor %}{% endif %}"
    "<end_of_utterance>\n{% endfor %}{% if add_generation_prompt %}Assistant:{% endif %}"
)


def _idefics3_config(model_type: str) -> Callable[[dict[str, int], int], dict[str, Any]]:
    """Idefics3 / SmolVLM: 64 px tiles of 16 px patches, pixel-shuffled 2 x 2: 4 tokens a tile."""

    def config(ids: dict[str, int], vocab: int) -> dict[str, Any]:
        text = {
            "model_type": "llama",
            "hidden_size": 64,
            "intermediate_size": 128,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "num_hidden_layers": 2,
            "rms_norm_eps": 1e-5,
            "rope_theta": 10000.0,
            "vocab_size": vocab,
        }
        vision = {
            "model_type": "idefics3_vision",
            "hidden_size": 32,
            "intermediate_size": 64,
            "num_attention_heads": 2,
            "num_hidden_layers": 2,
            "patch_size": 16,
            "image_size": 64,
        }
        return {
            "model_type": model_type,
            "text_config": text,
            "vision_config": vision,
            "vocab_size": vocab,
            "scale_factor": 2,
            "image_token_id": ids["<image>"],
            "pad_token_id": ids["<|endoftext|>"],
        }

    return config


def _idefics3_files(processor_class: str, image_processor: str) -> dict[str, dict[str, Any]]:
    return {
        "preprocessor_config.json": {
            "image_processor_type": image_processor,
            "processor_class": processor_class,
            "do_image_splitting": True,
            "max_image_size": {"longest_edge": 64},  # one tile
            "size": {"longest_edge": 128},  # so up to 2 x 2 tiles and the global view
            "image_mean": [0.5, 0.5, 0.5],
            "image_std": [0.5, 0.5, 0.5],
        },
        "processor_config.json": {"processor_class": processor_class, "image_seq_len": 4},
    }


_GEMMA3_TOKENS = (
    "<pad>",
    "<eos>",
    "<bos>",
    "<start_of_turn>",
    "<end_of_turn>",
    "<start_of_image>",
    "<end_of_image>",
    "<image_soft_token>",
)


def _gemma3_config(ids: dict[str, int], vocab: int) -> dict[str, Any]:
    text = {
        "model_type": "gemma3_text",
        "hidden_size": 64,
        "num_hidden_layers": 2,
        "intermediate_size": 128,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 16,
        "vocab_size": vocab,
        "query_pre_attn_scalar": 16,
        "sliding_window": 64,
        "sliding_window_pattern": 2,
        "mm_tokens_per_image": 16,
    }
    vision = {
        "model_type": "siglip_vision_model",
        "num_hidden_layers": 2,
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_attention_heads": 2,
        "patch_size": 8,
        "image_size": 64,
    }
    return {
        "model_type": "gemma3",
        "text_config": text,
        "vision_config": vision,
        "vocab_size": vocab,
        "hidden_size": 64,
        "mm_tokens_per_image": 16,
        "image_token_index": ids["<image_soft_token>"],
        "eos_token_id": [ids["<eos>"], ids["<end_of_turn>"]],
        "pad_token_id": ids["<pad>"],
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
    **{
        model_type: TinyFamily(
            model_type=model_type,
            special_tokens=_IDEFICS3_TOKENS,
            eos_token="<end_of_utterance>",
            pad_token="<|endoftext|>",
            chat_template=_IDEFICS3_TEMPLATE,
            config=_idefics3_config(model_type),
            files=_idefics3_files(processor, image_processor),
            media_tokens=_IDEFICS3_TOKENS[3:],
        )
        for model_type, processor, image_processor in (
            ("idefics3", "Idefics3Processor", "Idefics3ImageProcessor"),
            ("smolvlm", "SmolVLMProcessor", "SmolVLMImageProcessor"),
        )
    },
    # Refused by visioncache serve-mlx (stock vllm-mlx fails its image requests): the tests use it
    # to check the refusal.
    "gemma3": TinyFamily(
        model_type="gemma3",
        special_tokens=_GEMMA3_TOKENS,
        eos_token="<eos>",
        pad_token="<pad>",
        bos_token="<bos>",
        chat_template=_gemma_template(
            "<start_of_image>", "<bos>", "<start_of_turn>", "<end_of_turn>", "model"
        ),
        config=_gemma3_config,
        files={
            "preprocessor_config.json": {
                "image_processor_type": "Gemma3ImageProcessor",
                "processor_class": "Gemma3Processor",
                "size": {"height": 64, "width": 64},
                "image_mean": [0.5, 0.5, 0.5],
                "image_std": [0.5, 0.5, 0.5],
            },
            "processor_config.json": {"processor_class": "Gemma3Processor", "image_seq_length": 16},
        },
        stop_tokens=("<end_of_turn>",),
        tokenizer_attributes={
            "image_token": "<image_soft_token>",
            "boi_token": "<start_of_image>",
            "eoi_token": "<end_of_image>",
        },
    ),
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
