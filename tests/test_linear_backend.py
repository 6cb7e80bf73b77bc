"""The float32 linear backend: the panel kernel where it takes the shape (batch invariant), else measured once
per CPU and shapes and cached on disk; overridden by the environment."""
from __future__ import annotations

import glob
import json
import os

import pytest
import torch

from pagedllm import LLM
from pagedllm.model import cpu_kernels, linear_backend, linear_timing
from pagedllm.model.layers import MergedLinear
from pagedllm.model.linear_backend import ENV_VAR, choose_backends
from pagedllm.model.linear_timing import BACKENDS, ROWS, available, present

PANEL_SHAPES = [(96, 64), (192, 32)]  # whole panels at either width (24 or 48)
SHAPES = [(50, 64), (70, 32)]  # whole panels at neither: measured


@pytest.fixture
def cache_root(tmp_path, monkeypatch) -> str:
    monkeypatch.setattr(cpu_kernels, "CACHE_ROOT", str(tmp_path))
    monkeypatch.setattr(linear_timing, "_SAMPLES", 2)  # what is tested is the bookkeeping, not the figures
    monkeypatch.delenv(ENV_VAR, raising=False)
    return str(tmp_path)


@pytest.fixture
def measured(monkeypatch) -> list:
    """The shapes of each measurement made, which still runs."""
    calls, measure = [], linear_backend.measure

    def counting(shapes):
        calls.append(shapes)
        return measure(shapes)

    monkeypatch.setattr(linear_backend, "measure", counting)
    return calls


def test_panel_kernel_takes_every_shape_it_can_unmeasured(cache_root, measured):
    if "panels" not in present():
        pytest.skip("no C compiler built the panel kernel")
    choices = choose_backends([*PANEL_SHAPES, *SHAPES])
    assert {choices[shape] for shape in PANEL_SHAPES} == {"panels"}
    assert {choices[shape] for shape in SHAPES} <= {"onednn", "torch"}
    assert measured == [SHAPES]


def test_choice_is_measured_once_then_read_from_the_cache(cache_root, measured):
    choices = choose_backends(SHAPES)
    assert measured == [SHAPES]
    [path] = glob.glob(os.path.join(cache_root, "linear-backends-*.json"))
    with open(path) as f:
        record = json.load(f)
    assert record["torch"] == torch.__version__ and record["rows"] == list(ROWS)
    for out, k in SHAPES:
        layer = record["layers"][f"{out}x{k}"]
        assert set(layer["ms_per_call"]) == set(available((out, k)))
        assert all(t > 0 for times in layer["ms_per_call"].values() for t in times)
        assert layer["backend"] == choices[(out, k)]
        per_token = [sum(t / rows for t, rows in zip(times, ROWS)) for times in layer["ms_per_call"].values()]
        chosen = sum(t / rows for t, rows in zip(layer["ms_per_call"][layer["backend"]], ROWS))
        assert chosen <= min(per_token) + 1e-3  # the file's figures are rounded to 0.1 us
    assert choose_backends(reversed(SHAPES)) == choices
    assert len(measured) == 1
    choose_backends(SHAPES[:1])  # other shapes: measured anew
    assert len(measured) == 2


def test_decode_outweighs_prefill(cache_root, monkeypatch):
    names = available(SHAPES[0])[:2]
    if len(names) < 2:
        pytest.skip("one backend on this machine")
    fast_decode, fast_prefill = names
    # Per token: 1 + 2/8 + 128/256 = 1.75 against 1.2 + 2.4/8 + 32/256 = 1.625, then 1.75 against 1.875.
    for prefill, winner in [(32.0, fast_prefill), (96.0, fast_decode)]:
        timings = {fast_decode: [1.0, 2.0, 128.0], fast_prefill: [1.2, 2.4, prefill]}
        monkeypatch.setattr(linear_backend, "measure", lambda shapes: {shape: timings for shape in shapes})
        assert choose_backends([(50, int(prefill))]) == {(50, int(prefill)): winner}


def test_damaged_cache_is_measured_again(cache_root, measured):
    choose_backends(SHAPES)
    [path] = glob.glob(os.path.join(cache_root, "linear-backends-*.json"))
    with open(path, "w") as f:
        f.write("{not json")
    choose_backends(SHAPES)
    assert len(measured) == 2


@pytest.mark.parametrize("backend", BACKENDS)
def test_override_skips_measurement(cache_root, measured, monkeypatch, backend):
    if backend not in present():
        pytest.skip(f"no {backend} on this machine")
    monkeypatch.setenv(ENV_VAR, backend)
    choices = choose_backends([*PANEL_SHAPES, *SHAPES])
    assert {choices[shape] for shape in PANEL_SHAPES} == {backend}
    # No whole number of panels: the panel kernel cannot take them.
    assert {choices[shape] for shape in SHAPES} == {"torch" if backend == "panels" else backend}
    assert not measured and not os.listdir(cache_root)


def test_bad_override_is_an_error(cache_root, monkeypatch):
    monkeypatch.setenv(ENV_VAR, "mkl")
    with pytest.raises(ValueError, match=f"{ENV_VAR}='mkl'.*panels, onednn, torch"):
        choose_backends(SHAPES)


def _layout(layer: MergedLinear) -> tuple[str, tuple[int, int]]:
    """The layer's backend, read from how its weight is laid out, and its weight's shape."""
    if layer.panel_weight is not None:
        return "panels", (layer.panel_weight.shape[0] * layer.panel_weight.shape[2], layer.panel_weight.shape[1])
    if layer.packed_weight is not None:
        return "onednn", tuple(layer.packed_weight.shape)
    return "torch", tuple(layer.weight.shape)


@pytest.mark.slow
def test_loader_lays_each_layer_out_as_chosen(tiny_model_dir):
    llm = LLM(tiny_model_dir, num_gpu_blocks_override=16)  # held: the engine stops its worker when collected
    model = llm.llm_engine.model_executor.worker.model_runner.model
    layouts = [_layout(m) for m in model.modules() if isinstance(m, MergedLinear)]
    choices = choose_backends(shape for _, shape in layouts)  # this machine's choice, cached by the load
    assert layouts == [(choices[shape], shape) for _, shape in layouts]
