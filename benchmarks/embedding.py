"""Embedding throughput: pagedllm's `LLM.embed` against sentence-transformers' `encode`, in one invocation.

    python benchmarks/embedding.py [--workloads-file PATH] [--output PATH] [--batch-sizes 16,32,64,128]

The `embedding` workload's token-id texts (drawn as workloads.json prescribes) are decoded with the model's
tokenizer into strings, so that both sides tokenize the same text. Each side runs in its own process on the
default embedding model (all-MiniLM-L6-v2, the same folder): sentence-transformers at each batch size (its best
counts), then pagedllm; the script prints texts/s of both, their ratio (target at least 1.5x) and the least
cosine similarity between the two sides' vectors, and writes the figures as JSON.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.common import (add_engine_args, load_workload, machine_info, parse_engine_args,  # noqa: E402
                               run_in_child, token_prompts, write_result)

TARGET_RATIO = 1.5


def make_texts(workload: dict[str, Any]) -> list[str]:
    from transformers import AutoTokenizer

    from pagedllm.model.source import default_embedding_model_path

    tokenizer = AutoTokenizer.from_pretrained(default_embedding_model_path())
    return [tokenizer.decode(ids) for ids in token_prompts(workload, workload["num_texts"])]


def run_sentence_transformers(texts: list[str], batch_sizes: list[int]) -> dict[str, Any]:
    from sentence_transformers import SentenceTransformer

    from pagedllm.model.source import default_embedding_model_path

    model = SentenceTransformer(default_embedding_model_path(), device="cpu")
    model.encode(texts[:8])  # warm-up
    timings, best = {}, None
    for batch_size in batch_sizes:
        start = time.perf_counter()
        vectors = model.encode(texts, batch_size=batch_size, convert_to_tensor=True)
        timings[batch_size] = time.perf_counter() - start
        if best is None or timings[batch_size] < timings[best]:
            best, best_vectors = batch_size, vectors
    return {"elapsed_s_by_batch_size": {str(k): round(v, 3) for k, v in timings.items()}, "best_batch_size": best,
            "elapsed_s": round(timings[best], 3), "texts_per_s": round(len(texts) / timings[best], 2),
            "vectors": best_vectors.tolist()}


def run_pagedllm(texts: list[str], engine_kwargs: dict[str, Any]) -> dict[str, Any]:
    from pagedllm import LLM

    llm = LLM(task="embed", **engine_kwargs)
    llm.embed(texts[:8], use_tqdm=False)  # warm-up
    start = time.perf_counter()
    outputs = llm.embed(texts, use_tqdm=False)
    elapsed = time.perf_counter() - start
    return {"engine_args": engine_kwargs, "elapsed_s": round(elapsed, 3), "texts_per_s": round(len(texts) / elapsed, 2),
            "prompt_tokens": sum(len(o.prompt_token_ids) for o in outputs),
            "vectors": [o.outputs.embedding for o in outputs]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workloads-file", default=None, help="workloads.json (default: ../shared/bench)")
    parser.add_argument("--output", default=None, help="JSON file (default: benchmarks/results/<name>-<time>.json)")
    parser.add_argument("--batch-sizes", default="16,32,64,128", help="sentence-transformers batch sizes to try")
    add_engine_args(parser)
    args = parser.parse_args()
    import torch

    workload = load_workload("embedding", args.workloads_file)
    texts = make_texts(workload)
    baseline = run_in_child(run_sentence_transformers, texts, [int(b) for b in args.batch_sizes.split(",")])
    ours = run_in_child(run_pagedllm, texts, parse_engine_args(args))
    cosines = torch.nn.functional.cosine_similarity(torch.tensor(ours.pop("vectors")),
                                                    torch.tensor(baseline.pop("vectors")), dim=1)
    ratio = ours["texts_per_s"] / baseline["texts_per_s"]
    print(f"sentence-transformers (batch size {baseline['best_batch_size']}): {baseline['texts_per_s']:.1f} texts/s")
    print(f"pagedllm: {ours['texts_per_s']:.1f} texts/s ({ratio:.2f}x, target {TARGET_RATIO}x)")
    print(f"least cosine similarity between the two sides' vectors: {cosines.min().item():.7f}")
    result = {"workload": workload, "machine": machine_info(), "sentence_transformers": baseline, "pagedllm": ours,
              "ratio": round(ratio, 3), "target_ratio": TARGET_RATIO, "min_cosine": round(cosines.min().item(), 7)}
    print("written to", write_result(result, args.output, "embedding"))


if __name__ == "__main__":
    main()
