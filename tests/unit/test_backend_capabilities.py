"""Backends declare what they can do (``capabilities``, plain data on their config variant); the
backend classes expose the same declaration, the config variants' fields agree with it, and the
inference precision is its own setting (default: the training compute dtype)."""

from __future__ import annotations

import typing

import pytest
import torch

from zbrl.assembly.models import compute_dtype, inference_dtype, inference_dtype_name
from zbrl.config import load_config
from zbrl.config.rollout import Backend, lora_mode
from zbrl.config.rollout import TransformersBackend as TransformersOptions
from zbrl.config.rollout import VllmBackend as VllmOptions
from zbrl.rollout.backends.transformers.backend import TransformersBackend
from zbrl.rollout.backends.vllm.backend import VllmBackend
from zbrl.rollout.backends.vllm.lora import ENGINE_RANKS

VARIANTS = tuple(typing.get_args(a)[0] for a in typing.get_args(typing.get_args(Backend)[0]))


def test_every_backend_class_exposes_its_config_variants_declaration():
    assert TransformersBackend.capabilities is TransformersOptions.capabilities
    assert VllmBackend.capabilities is VllmOptions.capabilities
    assert set(VARIANTS) == {TransformersOptions, VllmOptions}


@pytest.mark.parametrize("variant", VARIANTS)
def test_a_variants_fields_agree_with_its_capabilities(variant):
    caps = variant.capabilities
    fields = variant.model_fields
    assert caps.tensor_parallel == ("tensor_parallel_size" in fields)
    assert caps.max_model_len == ("max_model_len" in fields)
    assert (len(caps.lora_modes) > 1) == ("lora_mode" in fields)
    if "lora_mode" in fields:
        assert typing.get_args(fields["lora_mode"].annotation) == caps.lora_modes
    assert lora_mode(variant()) == caps.lora_modes[0]
    if caps.max_served_lora_rank is not None:
        assert "adapters" in caps.lora_modes


def test_the_vllm_lora_rank_limit_is_the_engines():
    assert VllmOptions.capabilities.max_served_lora_rank == ENGINE_RANKS[-1]


def test_inference_precision_follows_the_compute_dtype_unless_set():
    cfg = load_config(None, ["model.dtype=bfloat16"])
    assert cfg.rollout.inference_dtype is None
    assert inference_dtype_name(cfg) == "bfloat16"
    assert inference_dtype(cfg) == compute_dtype(cfg) == torch.bfloat16
    cfg = load_config(None, ["model.dtype=bfloat16", "rollout.inference_dtype=float32"])
    assert inference_dtype(cfg) == torch.float32 and compute_dtype(cfg) == torch.bfloat16
