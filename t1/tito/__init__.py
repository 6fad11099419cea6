"""TITO: the exact-token buffer of an episode (buffer.py), template deltas (render.py), segments and diagnostics.

Modules:
- buffer.py: TokenBuffer: exact context ids for the sampler, the trajectory for the trainer
- render.py: ChatRenderer: the opening prompt and each observation delta; MismatchCause
- template_memo.py: memoised rendering: a learnt conversation shape renders by concatenation
- control_text.py: content that spells a control token (`<|im_end|>` in a command's output) tokenized as plain text
- tokenizer_fast_path.py: ids <-> text through the `tokenizers` backend directly
- segment.py: one segment under construction: ids, logprobs, loss mask, versions, routing, turns
- diagnostics.py: token drift in the loss region, the re-tokenization mismatch rate
- replay.py: a journaled buffer's segments rebuilt from its record

    renderer = ChatRenderer(tokenizer, end_of_turn="<|im_end|>", tools=tools)
    buf = TokenBuffer(renderer, opening_messages)
    result = await generate(GenerateRequest(session_id, buf.prompt_ids(), sampling))
    buf.append_generation(result, parsed_assistant_message)
    buf.append_observation([{"role": "tool", "content": output}])
    trajectory = buf.export(id=..., task_id=..., group_id=..., attempt=..., reward=..., status=...)
"""

from t1.tito.buffer import MismatchPolicy, TokenBuffer
from t1.tito.render import ChatRenderer

__all__ = ["ChatRenderer", "MismatchPolicy", "TokenBuffer"]
