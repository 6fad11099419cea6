"""Config of episodes: agent format, limits, sampling and concurrency."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from t1.config.base import Section


class SamplingConfig(Section):
    """Sampling parameters of every generation."""

    temperature: float = Field(1.0, ge=0, description="Softmax temperature; 0 is greedy.")
    top_p: float = Field(1.0, gt=0, le=1, description="Nucleus sampling mass.")
    top_k: int = Field(0, ge=0, description="Top-k sampling; 0 disables.")
    max_tokens: int = Field(512, ge=1, description="Most tokens sampled per turn.")


class CompactionConfig(Section):
    """Context compaction that starts a new segment."""

    enabled: bool = Field(True, description="Compact instead of ending at the context limit.")
    trigger_fraction: float = Field(0.85, gt=0, le=1, description="Compact when context use passes this share.")
    keep_last_turns: int = Field(2, ge=0, description="Recent turns kept verbatim.")
    max_segments: int = Field(8, ge=1, description="Most segments per episode.")
    mode: Literal["rule", "policy"] = Field(
        "rule", description="rule: the note lists the commands run and their exit codes; policy: the policy writes "
        "the note (one more generation, asked in its own chat template), trained with the episode's return; a "
        "summary that is empty, cut off, an action or over the note's length falls back to the rule (counted).")
    summary_max_tokens: int = Field(128, ge=8, description="policy: the summary's token budget (within the context).")
    teacher_lossy_share: float = Field(
        0.25, ge=0, le=1, description="policy: the share of the oracle teacher's demonstration episodes whose "
        "summaries drop the values a later step needs, and that keep no notes (`teacher_notes`): so SFT learns to "
        "write summaries and RL which ones pay.")
    teacher_notes: bool = Field(
        False, description="The oracle teacher's replies (any mode) open with a running note quoting the values a "
        "later step needs that the machine has shown (`Still needed: target: pink`), so the demonstrations copy "
        "them from the reply before, close by; none in its lossy episodes.")


class HarnessSamplingConfig(Section):
    """Which sampling parameters of a harness's calls the gateway honours."""

    honour: Literal["run", "request"] = Field(
        "run", description="run: rollout.sampling for every call (a call's max_tokens honoured up to its "
                           "max_tokens), what training needs; request: the call's temperature, top_p, top_k "
                           "and seed too, within the bounds below.")
    min_temperature: float = Field(0.0, ge=0, description="Lowest temperature a call gets (honour: request).")
    max_temperature: float = Field(2.0, ge=0, description="Highest temperature a call gets (honour: request).")
    min_top_p: float = Field(0.0, ge=0, le=1, description="Lowest top_p a call gets (honour: request).")


class HarnessConfig(Section):
    """An agent harness of the user's own run inside the sandbox instead of T1's loop (docs/harness.md)."""

    command: str = Field(
        "", description="Shell command line that runs the harness in the sandbox (cwd /app) until it exits; "
                        "empty: T1's own agent loop. It finds the gateway in OPENAI_BASE_URL / ANTHROPIC_BASE_URL "
                        "with the key in OPENAI_API_KEY / ANTHROPIC_API_KEY, and the task in $T1_INSTRUCTION_FILE.")
    env: dict[str, str] = Field(default_factory=dict, description="More environment variables for the harness.")
    timeout_s: float | None = Field(
        None, gt=0, description="Wall-clock limit of the harness; null: the task's agent timeout (times the "
                                "timeout multipliers).")
    output_cap_bytes: int = Field(65536, ge=1024, description="Tail of the harness's output kept for the transcript.")
    max_calls: int = Field(400, ge=1, description="Most generation calls per episode; later calls are refused.")
    port: int = Field(8087, ge=1, le=65535, description="Loopback port of the gateway inside the sandbox.")
    model_name: str = Field("t1", min_length=1, description="The model's name on the gateway (/v1/models).")
    on_template_rewrite: Literal["new_segment", "repair"] = Field(
        "new_segment", description="A call that extends the last one but renders otherwise under the template "
                                   "(Qwen3 with thinking off drops the empty think block of past turns): "
                                   "new_segment renders it afresh; repair keeps the ids the model saw and "
                                   "appends the delta (counted as template mismatches, as T1's own loop does).")
    sampling: HarnessSamplingConfig = Field(default_factory=HarnessSamplingConfig,
                                            description="Sampling parameters of the harness's calls.")


class RolloutConfig(Section):
    """One episode's shape and the scheduler around it."""

    agent_format: Literal["tool_calls", "terminus2"] = Field("tool_calls", description="How actions are written.")
    tool_schemas: bool = Field(
        True, description="Put the tools' JSON schemas into the tool-call prompt; false leaves them out (a policy "
                          "taught its tools by demonstrations; each episode about 260 tokens shorter).")
    policy: Literal["model", "oracle_script"] = Field(
        "model", description="Where actions come from: the model, or each task's reference solution typed as actions.")
    max_turns: int = Field(400, ge=1, description="Turn limit per episode.")
    max_bad_replies: int | None = Field(
        None, ge=1, description="End the episode after this many replies in a row with no valid action (its "
                                "verifiers still run, as at the turn limit); null: no limit.")
    max_context_tokens: int = Field(32768, ge=64, description="Context limit of one segment.")
    group_size: int = Field(8, ge=1, description="Attempts per task (G) for group-relative statistics.")
    max_concurrent_episodes: int = Field(1024, ge=1, description="Global concurrency limit.")
    steps_per_loop_tick: int = Field(
        32, ge=0, description="Most episode steps (half-turns) started per event-loop iteration; 0: unpaced.")
    timeout_multiplier: float = Field(1.0, gt=0, description="Scales the task's wall-clock timeouts.")
    turn_retries: int = Field(2, ge=0, description="Retries of a failed generation before the episode is an infra "
                                                   "error.")
    setup_retries: int = Field(
        2, ge=0, description="Fresh sandboxes tried when one is lost before the agent acted.")
    sampling: SamplingConfig = Field(default_factory=SamplingConfig, description="Sampling parameters.")
    compaction: CompactionConfig = Field(default_factory=CompactionConfig, description="Context compaction.")
    transcripts: bool = Field(True, description="Write a readable transcript per episode.")
    harness: HarnessConfig = Field(default_factory=HarnessConfig,
                                   description="A harness of your own instead of T1's agent loop (off by default).")
