"""TITO: the exact-token buffer of an episode (buffer.py), template deltas (render.py), segments and diagnostics.

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
