"""start_profile / stop_profile write a torch profiler trace into the folder named by the env var."""
from __future__ import annotations

import gzip
import json

import pytest

from pagedllm import LLM, SamplingParams


@pytest.fixture(scope="module")
def tiny_llm(tiny_model_dir):
    return LLM(tiny_model_dir, num_gpu_blocks_override=64)


@pytest.mark.parametrize("env", ["VLLM_TORCH_PROFILER_DIR", "PAGEDLLM_TORCH_PROFILER_DIR"])
def test_profile_writes_a_trace(tiny_llm, tmp_path, monkeypatch, env):
    monkeypatch.delenv("VLLM_TORCH_PROFILER_DIR", raising=False)
    monkeypatch.setenv(env, str(tmp_path))
    tiny_llm.start_profile()
    tiny_llm.generate([{"prompt_token_ids": [100, 101, 102]}], SamplingParams(max_tokens=2), use_tqdm=False)
    tiny_llm.stop_profile()
    traces = list(tmp_path.glob("rank0*.pt.trace.json.gz"))
    assert len(traces) == 1
    events = json.loads(gzip.decompress(traces[0].read_bytes()))["traceEvents"]
    assert any(str(e.get("name", "")).startswith("aten::") for e in events)


def test_profile_needs_the_folder(tiny_llm, monkeypatch):
    monkeypatch.delenv("VLLM_TORCH_PROFILER_DIR", raising=False)
    monkeypatch.delenv("PAGEDLLM_TORCH_PROFILER_DIR", raising=False)
    with pytest.raises(RuntimeError, match="Profiler is not enabled"):
        tiny_llm.start_profile()
    with pytest.raises(RuntimeError, match="not running"):
        tiny_llm.stop_profile()
