"""The per-episode gateway: an OpenAI- and Anthropic-compatible endpoint a harness in the sandbox calls as its model.

    harness (in the sandbox) --HTTP on its own loopback, the episode's key--> GatewayServer (server.py)
        --> openai_api.py / anthropic_api.py: the request as a ChatCall (call.py)
        --> GatewaySession (session.py): continue the segment or start one (by cause), generate with exact
            ids, logprobs and routing through the inference pool, record it in the episode's TITO buffer
        <-- the Completion in the caller's dialect (streamed or not)

renderers.py holds the model's chat renderer per tool list a harness sends, shared by the run's sessions.
The socket is opened inside the sandbox's network namespace (t1.sandbox.loopback_port); the harness
episode that runs a harness and exports the gateway's record is t1.agent.harness. docs/harness.md.
"""
