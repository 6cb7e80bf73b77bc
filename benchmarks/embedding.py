"""Embedding throughput: pagedllm's `LLM.embed` against sentence-transformers' `encode`, in one invocation.

    python benchmarks/embedding.py [--workloads-file PATH] [--output PATH] [--batch-sizes 16,32,64,128]
                                   [--repeats 2]

The `embedding` workload's token-id texts (drawn as workloads.json prescribes) are decoded with the model's
tokenizer into strings, so that both sides tokenize the same text. Each side runs in its own process on the
default embedding model (all-MiniLM-L6-v2, the same folder): sentence-transformers at each batch size (its best
counts), then pagedllm, then both again `--repeats` - 1 times (sentence-transformers at its best batch size),
each side's best run counting. The script prints texts/s of both, their ratio (target at least 1.5x) and the
least cosine similarity between the two sides' vectors, and writes the figures as JSON.

It also prints the machine's limit: the encoder's matmul FLOPs per text (its linear layers and attention's two
products, counted on the texts' token lengths) against the float32 matmul rate measured in the same invocation
(before and after the runs, the better counting), and the fraction of that limit each side reaches. Embedding
is compute-bound: no side can pass the limit, so the ratio it allows is the limit over the baseline's rate.
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


def make_texts(workload: dict[str, Any]) -> tuple[list[str], list[int]]:
    """The workload's texts, and their token lengths as the model tokenizes them (special tokens included)."""
    from transformers import AutoTokenizer

    from pagedllm.model.source import default_embedding_model_path

    tokenizer = AutoTokenizer.from_pretrained(default_embedding_model_path())
    texts = [tokenizer.decode(ids) for ids in token_prompts(workload, workload["num_texts"])]
    return texts, [len(ids) for ids in tokenizer(texts)["input_ids"]]


def encoder_flops(lengths: list[int]) -> float:
    """Matmul FLOPs of the default embedding model over texts of these token lengths: per token and layer the
    QKV, attention-output and two MLP projections (2 FLOPs per weight), plus attention's QK^T and AV products
    over the text's own length."""
    from transformers import AutoConfig

    from pagedllm.model.source import default_embedding_model_path

    c = AutoConfig.from_pretrained(default_embedding_model_path())
    h, layers = c.hidden_size, c.num_hidden_layers
    linear_per_token = 2 * (3 * h * h + h * h + 2 * h * c.intermediate_size)
    return layers * sum(n * linear_per_token + 2 * 2 * n * n * h for n in lengths)


def matmul_rates() -> dict[str, float]:
    """float32 FLOP/s on PyTorch's default path: machine_limits' prefill matmul, and a 2048-token step through
    the encoder's MLP shape (384 -> 1536)."""
    from benchmarks.machine_limits import matmul_rate

    return {"default_shape": matmul_rate(), "encoder_mlp_shape": matmul_rate(shape=(2048, 384, 1536))}


def _best(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The fastest of a side's runs, with every run's time."""
    best = min(runs, key=lambda r: r["elapsed_s"])
    return {**best, "elapsed_s_by_run": [r["elapsed_s"] for r in runs]}


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
    parser.add_argument("--repeats", type=int, default=2, help="runs of each side, interleaved; the best counts")
    add_engine_args(parser)
    args = parser.parse_args()
    import torch

    workload = load_workload("embedding", args.workloads_file)
    texts, lengths = make_texts(workload)
    engine_kwargs = parse_engine_args(args)
    rates = [run_in_child(matmul_rates)]
    st_runs = [run_in_child(run_sentence_transformers, texts, [int(b) for b in args.batch_sizes.split(",")])]
    our_runs = [run_in_child(run_pagedllm, texts, engine_kwargs)]
    cosines = torch.nn.functional.cosine_similarity(torch.tensor(our_runs[0].pop("vectors")),
                                                    torch.tensor(st_runs[0].pop("vectors")), dim=1)
    for _ in range(args.repeats - 1):
        st_runs.append(run_in_child(run_sentence_transformers, texts, [st_runs[0]["best_batch_size"]]))
        our_runs.append(run_in_child(run_pagedllm, texts, engine_kwargs))
        st_runs[-1].pop("vectors"), our_runs[-1].pop("vectors")
    rates.append(run_in_child(matmul_rates))
    baseline, ours = _best(st_runs), _best(our_runs)
    ratio = ours["texts_per_s"] / baseline["texts_per_s"]
    rate = max(max(r[k] for k in ("default_shape", "encoder_mlp_shape")) for r in rates)
    flops_per_text = encoder_flops(lengths) / len(texts)
    limit = rate / flops_per_text  # texts/s at the matmul rate, with everything else free
    per_token = flops_per_text / (sum(lengths) / len(texts))
    print(f"machine limit: {flops_per_text / 1e9:.2f} GFLOP per text ({per_token / 1e6:.1f} MFLOP per token) at "
          f"{rate / 1e9:.0f} GFLOP/s = {limit:.1f} texts/s")
    print(f"sentence-transformers (batch size {baseline['best_batch_size']}): {baseline['texts_per_s']:.1f} texts/s "
          f"({baseline['texts_per_s'] / limit:.0%} of the limit)")
    print(f"pagedllm: {ours['texts_per_s']:.1f} texts/s ({ours['texts_per_s'] / limit:.0%} of the limit; {ratio:.2f}x, "
          f"target {TARGET_RATIO}x; the limit allows at most {limit / baseline['texts_per_s']:.2f}x)")
    print(f"least cosine similarity between the two sides' vectors: {cosines.min().item():.7f}")
    limits = {"matmul_flops_per_s": round(rate), "matmul_rates_before_after": rates,
              "flops_per_text": round(flops_per_text), "limit_texts_per_s": round(limit, 2),
              "sentence_transformers_fraction_of_limit": round(baseline["texts_per_s"] / limit, 3),
              "pagedllm_fraction_of_limit": round(ours["texts_per_s"] / limit, 3),
              "ratio_allowed_by_limit": round(limit / baseline["texts_per_s"], 3)}
    result = {"workload": workload, "machine": machine_info(), "limit": limits, "sentence_transformers": baseline,
              "pagedllm": ours, "ratio": round(ratio, 3), "target_ratio": TARGET_RATIO,
              "min_cosine": round(cosines.min().item(), 7)}
    print("written to", write_result(result, args.output, "embedding"))


if __name__ == "__main__":
    main()
