"""Shared fixtures: one engine on the real default model per session, tiny random-weight models, and a real
OTLP trace collector."""
from __future__ import annotations

import contextlib
import functools
import os
import threading
from concurrent import futures
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Callable, Iterator

import pytest
import torch

from pagedllm.model.source import default_model_path

# Small thread counts keep the suite's timings steady on 2 cores.
torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))


@pytest.fixture(scope="session")
def default_model() -> str:
    return default_model_path()


@pytest.fixture(scope="session")
def llm():
    """The default model behind one LLM shared by the whole session (tests must not change its state)."""
    from pagedllm import LLM

    return LLM()


@pytest.fixture(scope="session")
def tokenizer(llm):
    return llm.get_tokenizer()


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory, tokenizer) -> str:
    """A 2-layer Llama with random weights and the default model's tokenizer, as a Hugging Face folder."""
    from transformers import LlamaConfig, LlamaForCausalLM

    folder = tmp_path_factory.mktemp("tiny-llama")
    # Sizes in whole panels of the C matmul (48 columns with AVX-512, 24 without), as the default model has:
    # its tests run the path that model runs, CPU graphs included.
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=96, intermediate_size=192, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                         tie_word_embeddings=True, bos_token_id=tokenizer.bos_token_id,
                         eos_token_id=tokenizer.eos_token_id)
    torch.manual_seed(0)
    LlamaForCausalLM(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return str(folder)


class OTLPCollector:
    """Spans received over OTLP (gRPC or HTTP/protobuf) by a collector on 127.0.0.1."""

    def __init__(self, protocol: str) -> None:
        self.spans: list = []
        self._lock = threading.Lock()
        self.endpoint, self.stop = (self._serve_grpc() if protocol == "grpc" else self._serve_http())

    def _add(self, request) -> None:
        with self._lock:
            for resource_spans in request.resource_spans:
                for scope_spans in resource_spans.scope_spans:
                    self.spans.extend(scope_spans.spans)

    def _serve_grpc(self) -> tuple[str, Callable[[], None]]:
        import grpc
        from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc

        collector = self

        class Service(trace_service_pb2_grpc.TraceServiceServicer):
            def Export(self, request, context):  # noqa: N802 - the OTLP service's method name
                collector._add(request)
                return trace_service_pb2.ExportTraceServiceResponse()

        server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
        trace_service_pb2_grpc.add_TraceServiceServicer_to_server(Service(), server)
        port = server.add_insecure_port("127.0.0.1:0")
        server.start()
        return f"http://127.0.0.1:{port}", lambda: server.stop(None)

    def _serve_http(self) -> tuple[str, Callable[[], None]]:
        from opentelemetry.proto.collector.trace.v1 import trace_service_pb2

        collector = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's method name
                request = trace_service_pb2.ExportTraceServiceRequest()
                request.ParseFromString(self.rfile.read(int(self.headers["Content-Length"])))
                collector._add(request)
                reply = trace_service_pb2.ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(reply)))
                self.end_headers()
                self.wfile.write(reply)

            def log_message(self, *args) -> None:
                pass

        server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=server.serve_forever, daemon=True).start()

        def stop() -> None:
            server.shutdown()
            server.server_close()

        return f"http://127.0.0.1:{server.server_address[1]}/v1/traces", stop

    @staticmethod
    def attributes(span) -> dict:
        return {kv.key: getattr(kv.value, kv.value.WhichOneof("value")) for kv in span.attributes}


@pytest.fixture
def otlp_collector() -> Iterator[Callable[[str], OTLPCollector]]:
    """`otlp_collector("grpc" | "http/protobuf")` starts a collector that stops when the test ends."""
    started: list[OTLPCollector] = []

    def start(protocol: str) -> OTLPCollector:
        started.append(OTLPCollector(protocol))
        return started[-1]

    yield start
    for collector in started:
        collector.stop()


@contextlib.contextmanager
def _gguf_read_once() -> Iterator[None]:
    """transformers parses a GGUF file's metadata for the config and again for the tensors, and rebuilds gguf's
    tensor name map for each of the model's modules (about 400 times); both are pure, and done once each they
    take 20 s less of a 2-core machine."""
    import gguf

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(gguf, "GGUFReader", functools.cache(gguf.GGUFReader))
        patch.setattr(gguf, "get_tensor_name_map", functools.cache(gguf.get_tensor_name_map))
        yield


@pytest.fixture(scope="session")
def hf_model(default_model):
    """The default model's weights in Hugging Face transformers' own Llama, the reference for ours."""
    from transformers import AutoConfig, LlamaForCausalLM
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    folder, file = os.path.split(default_model)
    with _gguf_read_once():
        model = LlamaForCausalLM(AutoConfig.from_pretrained(folder, gguf_file=file))
        tensors = load_gguf_checkpoint(default_model, return_tensors=True, model_to_load=model)["tensors"]
    model.load_state_dict({k: torch.as_tensor(v) for k, v in tensors.items()}, strict=False)
    model.tie_weights()
    return model.eval()
