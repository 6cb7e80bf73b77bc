"""The `pagedllm` command line on a tiny model: generate prints the completion, chat reads stdin."""
from __future__ import annotations

import io

import pytest

from pagedllm import LLM, SamplingParams
from pagedllm.entrypoints.cli import main

SAMPLING = SamplingParams(temperature=1.0, seed=3, max_tokens=6)


@pytest.fixture(scope="module")
def engine_flags(tiny_model_dir) -> list[str]:
    # Random weights: seeded sampling gives varied, printable tokens where greedy may repeat one byte piece.
    return ["--model", tiny_model_dir, "--num-gpu-blocks-override", "32", "--max-tokens", "6",
            "--temperature", "1", "--seed-sampling", "3"]


@pytest.fixture(scope="module")
def tiny_llm(tiny_model_dir):
    return LLM(tiny_model_dir, num_gpu_blocks_override=32)


def test_generate_prints_prompt_and_completion(engine_flags, tiny_llm, capsys):
    main(["generate", "The sky is", *engine_flags])
    expected = tiny_llm.generate("The sky is", SAMPLING, use_tqdm=False)
    text = expected[0].outputs[0].text
    assert text
    assert capsys.readouterr().out == f"The sky is{text}\n"


def test_chat_reads_stdin_until_an_empty_line(engine_flags, tiny_llm, capsys, monkeypatch):
    monkeypatch.setattr("sys.stdin", io.StringIO("Hello there\n\nnever read\n"))
    main(["chat", *engine_flags])
    out = capsys.readouterr().out
    reply = tiny_llm.chat([{"role": "user", "content": "Hello there"}], SAMPLING,
                          use_tqdm=False)[0].outputs[0].text
    assert out.startswith("Chat with the model")
    assert reply and reply in out
    assert out.count("> ") == 2  # one turn, then the empty line ends the chat


def test_unknown_flag_is_an_error(capsys):
    with pytest.raises(SystemExit):
        main(["generate", "x", "--no-such-flag"])
    assert "--no-such-flag" in capsys.readouterr().err
