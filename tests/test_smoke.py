from pagedllm import LLM, SamplingParams


def test_tiny_model_generates_requested_tokens(tiny_model_dir):
    llm = LLM(tiny_model_dir, num_gpu_blocks_override=64)
    outputs = llm.generate(["Hello there", "A longer prompt than the first one"],
                           SamplingParams(temperature=0, max_tokens=8, ignore_eos=True), use_tqdm=False)
    assert [len(o.outputs[0].token_ids) for o in outputs] == [8, 8]
    assert all(o.outputs[0].finish_reason == "length" for o in outputs)
