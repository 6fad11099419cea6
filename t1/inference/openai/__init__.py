"""`OpenAIPool`: the replica set (t1/inference/client/) over OpenAI-compatible HTTP servers.

- openai_pool.py: `OpenAIPool`: `vllm serve` fleets with exact tokens, SGLang, hosted APIs for text-level
  evals; a completions pool is a GenerateFn.
- openai_transport.py: one endpoint's client: slots, retryable replies, weight reloads on vLLM.
- openai_weights.py: loading a weights folder on a vLLM server through its dev-mode endpoints.
- openai_wire.py: the request bodies T1 sends and the reply checks (pure functions).
- openai_reply.py: reading a reply as an adversary might write it: bounded, parsed off the loop.
- openai_messages.py: T1's conversation as chat messages, and a reply's tool calls as text T1's formats parse.
"""
