"""POST /tokenize and /detokenize: the server's tokenizer, with the chat template for messages."""
from __future__ import annotations

from pagedllm.entrypoints.openai.errors import APIError
from pagedllm.entrypoints.openai.protocol import (DetokenizeRequest, DetokenizeResponse, TokenizeRequest,
                                                  TokenizeResponse)
from pagedllm.entrypoints.openai.serving_engine import OpenAIServing


class OpenAIServingTokenization(OpenAIServing):
    async def create_tokenize(self, request: TokenizeRequest) -> TokenizeResponse:
        self.model_name(request.model)
        if (request.prompt is None) == (request.messages is None):
            raise APIError("Give exactly one of `prompt` and `messages`.", param="prompt")
        if request.messages is not None:
            text = await self.render_chat(request.messages, request.add_generation_prompt,
                                          request.continue_final_message)
            add_special_tokens = bool(request.add_special_tokens)
        else:
            text = request.prompt
            add_special_tokens = request.add_special_tokens is not False
        tokens = (await self.tokenize(text, add_special_tokens))["prompt_token_ids"]
        token_strs = self.tokenizer.convert_ids_to_tokens(tokens) if request.return_token_strs else None
        return TokenizeResponse(count=len(tokens), max_model_len=self.max_model_len, tokens=tokens,
                                token_strs=token_strs)

    async def create_detokenize(self, request: DetokenizeRequest) -> DetokenizeResponse:
        self.model_name(request.model)
        vocab_size = len(self.tokenizer)
        for token_id in request.tokens:
            if not 0 <= token_id < vocab_size:
                raise APIError(f"Token id {token_id} is out of vocabulary", param="tokens")
        return DetokenizeResponse(prompt=await self._off_loop(self.tokenizer.decode, request.tokens))
