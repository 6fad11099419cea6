"""The agent: action formats (chat-template tool calls, Terminus-2 JSON) and the episode loop.

Modules:
- episode.py: the episode: one task attempt from sandbox to trajectory (turns, limits, verifiers, rewards,
  infra errors)
- episode_types.py: the values around an episode (spec, end, result, sandbox source) and which failures are
  infrastructure's
- episode_verifier.py: an episode's verifier runs (final, every K-th turn, the baseline) in verifier shells
- resume_point.py: where an unfinished episode's journal lets a restarted coordinator continue it
- shell_state.py: the agent shell's directory and exported variables, probed per turn and restored in a new shell
- episode_limits.py: what one episode may do (rollout and reward limits)
- formats.py: agent formats: how the policy writes actions (tool calls, Terminus-2 JSON) and how outputs go
  back
- policy_call.py: one call of the policy for a turn: exact tokens from a GenerateFn, or text from a chat
  endpoint
- harness.py: a harness episode: the user's own agent in the sandbox calls the episode's gateway (t1/gateway)
- baseline.py: the process reward's baseline (verifiers passing before the first turn), measured once per
  group
- compaction.py: context compaction as a pure function: the opening, a note of what was done, the last turns
- context_fit.py: ContextFit: an episode's context kept within its limits by compaction (the rule's note or
  the policy's summary), each compaction a new segment
- pacing.py: bounded event-loop iterations when thousands of episodes wake at once
- scripted.py: a scripted policy: a GenerateFn that types a task's reference solution
- transcript.py: the per-episode Markdown transcript, written turn by turn
- turn_journal.py: the seam between an episode and its journal (t1/coordinator/spool/journal.py is the real one)
"""
