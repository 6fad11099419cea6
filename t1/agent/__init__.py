"""The agent: action formats (chat-template tool calls, Terminus-2 JSON) and the episode loop."""
