"""Names the dead-code check over t1/ and bench/ without tests (`make dead-code`, its second pass) must not report:
names that T1's own code never uses and that stay for a stated reason. The pass finds what only tests use; a new
name it reports is removed, or moved into the tests, unless it belongs to one of the kinds below, where it goes
with its reason.

Each name is read by something the pass cannot see: a framework, a configuration value, an operator, or a test
that observes a part from outside (a counter, a probe, a hook), or it is a module's function kept beside the
code it mirrors. Removed when this pass was added: job_pass_at_k, read_run_log and segment_sampled (helpers
that only tests called; the tests now do what they did).
"""

# ruff: noqa
# mypy: ignore-errors
_ = object()

# gRPC handlers, called by grpc through the generated servicer bases (t1/v1 is outside the pass).
_.GetRunStatus, _.SaveCheckpoint
# Enum members chosen by a configuration or command-line value, never named in code.
TERMINUS2  # t1/agent/formats.py FormatName: rollout.agent_format: terminus2
BASH  # bench/sim_replies.py CommandMix: bench.sim_inference --commands bash
# The Shell protocol's terminal input and a command result's size: for harnesses that drive a terminal
# (t1/sandbox/types.py, t1/sandbox/ssh/terminal.py) and what a result reports.
_.keystrokes, _.output_bytes
# Counters and state a part keeps for whoever observes it (tests, an operator's debugger, the run status):
# the sandbox pool's failed creates and destroys, the trainer link's rejected records and reconnects, KV slots'
# moves and free slots, the image builder's builds, a forked child's native thread id, the baseline's
# measured flag, pacing's deferred steps, the routing report's all-zero rows.
_.create_failures, _.destroy_failures, _.rejected, _.reconnects, _.moves, _.num_free, _.builds, _.native_id
_.measured, _.deferred, _.all_zero_rows
# Probes an operator runs against a live process: the replica set's latest weights and a session's replica,
# a sandbox's peak memory, the standard gRPC health and reflection clients (t1/rpc/introspect.py).
_.latest_weights, _.replica_of, _.memory_peak_mb, health_status, list_services
# Hooks for fault tests, documented where they live: an inference servicer that holds its generations (a
# stalled server, t1/inference/server/servicer.py) and the embedded sshd killing its sessions (a dropped link).
_.hold_generation, _.kill_sessions
# Module functions kept beside the code they mirror: the spool's record
# encoder (the writer writes head and payload apart; this is the frame they make), a non-blocking spool cursor
# read, routing arrays joined and validated (the codec's and the trainer's checks), the view's episode query,
# the learning PNG's panel reader, the README config reference reader, and the Qwen3-vocab tokenizer builder.
encode_record, _.next_nowait, concat_arrays, validate_routing, run_query, read_panels, embedded_reference
qwen3_tokenizer
