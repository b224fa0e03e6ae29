"""Self-hosted and hosted OpenAI-compatible servers (`openai_compatible`: vLLM, Ollama, Groq, Together,
Mistral...): the OpenAI wire without what such servers commonly lack.

- Chat Completions (and an Anthropic Messages client translated to it) and embeddings only: no
  Responses, no compact, no Files API, so eligibility keeps those requests away (`capability`).
- A stream is sent as the client asked: the gateway does not add `stream_options` (older vLLM and some
  hosted servers reject the field). A stream whose server reports no usage is recorded with unknown usage
  and cost (NULL), never zero; a client that asks for usage still gets what the server sends.
- Tools are the assignment's declared capability, as on any account: `capabilities: {tools: false}` for a
  server without function calling, and a turn that offers tools is then ineligible there (never stripped
  of them). The credential, if any, is a Bearer token.
"""

from proxy.providers.base import CHAT, EMBEDDINGS, MESSAGES
from proxy.providers.openai import OpenAI


class OpenAICompatible(OpenAI):
    name = "openai_compatible"
    routes = frozenset({CHAT, MESSAGES, EMBEDDINGS})
    asks_stream_usage = False


PROVIDER = OpenAICompatible()
