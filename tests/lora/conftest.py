"""LoRA adapters made with peft on the default model's Hugging Face form, with fixed seeds and non-zero B."""
from __future__ import annotations

import copy
from pathlib import Path
from typing import Optional

import pytest
import torch

ALL_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
# Random B at this scale moves the model's greedy tokens visibly without turning them into noise.
B_STD = 0.06


def _make_adapter(hf_model, folder: Path, seed: int, rank: int = 8, alpha: int = 16, use_rslora: bool = False,
                 targets: Optional[list[str]] = None):
    """Save a PEFT adapter of `hf_model` (left unchanged) in `folder`; return the PeftModel that applies it."""
    from peft import LoraConfig, get_peft_model

    config = LoraConfig(r=rank, lora_alpha=alpha, use_rslora=use_rslora, target_modules=targets or ALL_TARGETS,
                        lora_dropout=0.0, bias="none")
    model = get_peft_model(copy.deepcopy(hf_model), config)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if "lora_A" in name:
                parameter.copy_(torch.randn(parameter.shape, generator=generator) / parameter.shape[1] ** 0.5)
            elif "lora_B" in name:
                parameter.copy_(torch.randn(parameter.shape, generator=generator) * B_STD)
    model.save_pretrained(str(folder))
    return model.eval()


@pytest.fixture(scope="session")
def make_adapter(hf_model):
    """make_adapter(folder, seed, rank=8, alpha=16, use_rslora=False, targets=None) -> the PeftModel it saved."""
    return lambda folder, seed, **spec: _make_adapter(hf_model, folder, seed, **spec)


@pytest.fixture(scope="session")
def adapters(tmp_path_factory, hf_model) -> list[str]:
    """Four adapters' folders: rank 8, rank 16 under rsLoRA, rank 8 on attention only, rank 16."""
    root = tmp_path_factory.mktemp("adapters")
    specs = [dict(rank=8), dict(rank=16, use_rslora=True), dict(rank=8, targets=["q_proj", "v_proj", "o_proj"]),
             dict(rank=16, alpha=32)]
    folders = []
    for i, spec in enumerate(specs):
        folder = root / f"adapter{i}"
        _make_adapter(hf_model, folder, seed=100 + i, **spec)
        folders.append(str(folder))
    return folders


@pytest.fixture(scope="session")
def lora_llm():
    """The default model with LoRA on: four slots, ranks up to 16 (tests must not leave adapters pinned)."""
    from pagedllm import LLM

    return LLM(enable_lora=True, max_loras=4, max_lora_rank=16)
