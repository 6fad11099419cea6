"""Every Prometheus metric of the coordinator, registered once on T1's own registry.

Names follow docs/design.md's Metrics section. Trainer-side values (logprob diff, KL, clip
fraction, ...) arrive in the trainer's status and are mirrored here by `set_trainer_metrics`,
so one /metrics endpoint and one run log show the whole run. Metrics other planes keep on
prometheus_client's default registry (TITO repair counters, pools) are bridged into this one,
unless this registry already defines the name (then ours, the mirrored value, wins).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping

import prometheus_client
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.metrics_core import Metric

REGISTRY = CollectorRegistry(auto_describe=True)

_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 180)
_LAG_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5)

# -- fidelity (mirrored from the trainer and the TITO buffers) ---------------------------------
TRAIN_INFER_LOGPROB_ABS_DIFF = Gauge(
    "t1_train_infer_logprob_abs_diff", "Mean |logp_train - logp_rollout| over loss tokens, before the update.",
    registry=REGISTRY)
TITO_DRIFT_TOKENS = Gauge("t1_tito_drift_tokens", "Tokens in the loss region that differ from the sampler's (must be "
                                                  "0).",
                          registry=REGISTRY)
# t1_tito_repaired_turns is counted by t1.tito (default registry) in this process and bridged.
RETOKENIZE_MISMATCH_RATE = Gauge(
    "t1_retokenize_mismatch_rate", "Share of sampled tokens a re-tokenizing pipeline would get "
                                   "wrong.", registry=REGISTRY)
ROUTING_REPLAY_COVERAGE = Gauge(
    "t1_routing_replay_coverage", "Share of (token, MoE layer) rows replayed from a record in the last step",
    registry=REGISTRY)
ROUTER_DISAGREEMENT_RATE = Gauge(
    "t1_router_disagreement_rate", "Share of replayed selections the trainer's router would have chosen differently.",
    registry=REGISTRY)

# -- rollouts ---------------------------------------------------------------------------------
ROLLOUT_TURNS = Counter("t1_rollout_turns", "Agent turns completed.", registry=REGISTRY)
ROLLOUT_TURNS_PER_SECOND = Gauge("t1_rollout_turns_per_second", "Agent turns per second, last window.",
                                 registry=REGISTRY)
TURN_LATENCY = Histogram("t1_turn_latency_seconds", "Wall time of one turn (generate + command).", ["part"],
                         buckets=_LATENCY_BUCKETS, registry=REGISTRY)
ACTIVE_EPISODES = Gauge("t1_active_episodes", "Episodes running now (live sessions).", registry=REGISTRY)
EPISODES = Counter("t1_episodes", "Finished episodes by status.", ["status"], registry=REGISTRY)
INFRA_FAILURES = Counter("t1_infra_failures", "Infra failures by kind.", ["kind"], registry=REGISTRY)
INFRA_FAILURE_RATE = Gauge("t1_infra_failure_rate", "Share of finished episodes that were infra errors.",
                           registry=REGISTRY)
INFERENCE_RETRIES = Counter("t1_inference_retries", "Turns retried on another replica.", registry=REGISTRY)
GATEWAY_CALLS = Counter("t1_gateway_calls", "Generation calls a harness made through its episode's gateway.",
                        registry=REGISTRY)
GATEWAY_SEGMENTS = Counter("t1_gateway_segment_starts", "Segments a gateway call started, by cause.", ["cause"],
                           registry=REGISTRY)
GATEWAY_REFUSED = Counter("t1_gateway_refused", "Gateway requests refused, by reason.", ["reason"], registry=REGISTRY)
COMPACTIONS = Counter("t1_agent_compactions", "Context compactions by the note the next segment opens with: the "
                      "rule's, the policy's summary, or the rule's after a malformed summary.", ["note"],
                      registry=REGISTRY)
BAD_REPLIES = Counter("t1_agent_bad_replies", "Model replies that did not parse as an action.", ["format"],
                      registry=REGISTRY)
EVENT_LOOP_LAG = Histogram("t1_event_loop_lag_seconds", "Lateness of the coordinator's event loop.",
                           buckets=_LAG_BUCKETS, registry=REGISTRY)
GC_FULL_SECONDS = Histogram("t1_gc_full_collection_seconds", "Scheduled full garbage collections (the loop stands "
                                                             "still).",
                            buckets=_LAG_BUCKETS, registry=REGISTRY)
EPISODE_REWARD = Histogram("t1_episode_reward", "Episode rewards (infra errors excluded).",
                           buckets=(0, 0.25, 0.5, 0.75, 1, 2, 3, 5, 10, 20), registry=REGISTRY)
RESOLVE_RATE = Gauge("t1_resolve_rate", "Resolve rate of the last window or eval job.", ["split"], registry=REGISTRY)
POLICY_LAG = Gauge("t1_policy_lag", "Current policy version minus the oldest version in the last trajectory.",
                   registry=REGISTRY)
POLICY_VERSION = Gauge("t1_policy_version", "Weight version the inference servers serve.", registry=REGISTRY)

# -- trainer (mirrored) -------------------------------------------------------------------------
KL = Gauge("t1_kl", "k3 estimate of KL(updated || pre-update policy) over the last step's action tokens.",
           registry=REGISTRY)
CLIP_FRACTION = Gauge("t1_clip_fraction", "Share of tokens whose PPO ratio was clipped.", registry=REGISTRY)
VALUE_LOSS = Gauge("t1_value_loss", "Critic loss.", registry=REGISTRY)
EXPLAINED_VARIANCE = Gauge("t1_explained_variance", "Explained variance of the critic.", registry=REGISTRY)
TRAINER_STEP = Gauge("t1_trainer_step", "Trainer step.", registry=REGISTRY)

# -- spool ----------------------------------------------------------------------------------
SPOOL_PENDING = Gauge("t1_spool_pending_trajectories", "Trajectories spooled and not yet acknowledged.",
                      registry=REGISTRY)
SPOOL_PENDING_BYTES = Gauge("t1_spool_pending_bytes", "Bytes spooled and not yet acknowledged.", registry=REGISTRY)
SPOOL_BLOCKED = Gauge("t1_spool_backpressure", "1 while the spool is full and admission is held back.",
                      registry=REGISTRY)
SPOOL_BLOCKED_SECONDS = Counter("t1_spool_backpressure_seconds", "Time admission was held back by the spool.",
                                registry=REGISTRY)
SPOOL_APPENDED = Counter("t1_spool_appended", "Trajectories appended to the spool.", registry=REGISTRY)
SPOOL_APPENDED_BYTES = Counter("t1_spool_appended_bytes", "Payload bytes appended to the spool.", registry=REGISTRY)
SPOOL_ACKED = Counter("t1_spool_acked", "Trajectories acknowledged by the trainer.", registry=REGISTRY)
SPOOL_WRITE_FAILING = Gauge("t1_spool_write_failing", "1 while spool writes fail (new episodes are held back).",
                            registry=REGISTRY)
SPOOL_WRITE_ERRORS = Counter("t1_spool_write_errors", "Spool writes that failed (each is retried).", registry=REGISTRY)
WRITE_FAILING = Gauge("t1_write_failing", "1 while writes of this file kind fail (transcripts, run log, eval job "
                      "database): the run goes on without it.", ["file"], registry=REGISTRY)
SPOOL_HELD = Gauge("t1_spool_held_trajectories", "Finished trajectories held in memory until the spool writes again.",
                   registry=REGISTRY)
SPOOL_DAMAGED_BYTES = Counter("t1_spool_damaged_bytes", "Spool bytes found damaged on recovery (kept in .corrupt "
                                                        "files).",
                              registry=REGISTRY)
SPOOL_DAMAGED_RANGES = Counter("t1_spool_damaged_ranges", "Damaged byte ranges found on spool recovery.",
                               registry=REGISTRY)
EPISODES_RESUMED = Counter("t1_episodes_resumed", "Episodes a dead coordinator left, continued from their last turn.",
                           registry=REGISTRY)
JOURNAL_BYTES = Counter("t1_journal_bytes", "Bytes appended to live episodes' journals.", registry=REGISTRY)
JOURNAL_SYNCS = Counter("t1_journal_syncs", "Syncs of the journal to disk (one per window covers every episode).",
                        registry=REGISTRY)
JOURNAL_WRITE_ERRORS = Counter("t1_journal_write_errors", "Journal writes or syncs that failed (each is retried).",
                               registry=REGISTRY)
JOURNAL_WRITE_FAILING = Gauge("t1_journal_write_failing", "1 while journal writes fail (turns are held in memory).",
                              registry=REGISTRY)
JOURNAL_BACKLOG = Gauge("t1_journal_backlog_bytes", "Journal bytes queued and not yet written.", registry=REGISTRY)
TRAINER_QUARANTINED_GROUPS = Gauge("t1_trainer_quarantined_groups", "Groups the trainer set aside after a failed step.",
                                   registry=REGISTRY)
TRAINER_CONNECTED = Gauge("t1_trainer_connected", "1 while the trajectory stream to the trainer is open.",
                          registry=REGISTRY)

# Trainer status keys -> gauges.
_TRAINER_KEYS: dict[str, Gauge] = {
    "logprob_abs_diff": TRAIN_INFER_LOGPROB_ABS_DIFF,
    "train_infer_logprob_abs_diff": TRAIN_INFER_LOGPROB_ABS_DIFF,
    "tito_drift_tokens": TITO_DRIFT_TOKENS,
    "retokenize_mismatch_rate": RETOKENIZE_MISMATCH_RATE,
    "routing_replay_coverage": ROUTING_REPLAY_COVERAGE,
    "router_disagreement_rate": ROUTER_DISAGREEMENT_RATE,
    "kl": KL,
    "approx_kl": KL,
    "clip_fraction": CLIP_FRACTION,
    "value_loss": VALUE_LOSS,
    "explained_variance": EXPLAINED_VARIANCE,
    "policy_lag": POLICY_LAG,
}


def set_trainer_metrics(values: Mapping[str, float]) -> None:
    """Mirror the trainer's last step metrics; keys may carry a 't1_' prefix or a 'loss/' style group."""
    for key, value in values.items():
        name = key.removeprefix("t1_").rsplit("/", 1)[-1]
        gauge = _TRAINER_KEYS.get(name)
        if gauge is not None:
            gauge.set(float(value))


class _DefaultRegistryBridge:
    """Collects t1_* families from prometheus_client's default registry that this registry lacks."""

    def describe(self) -> list[Metric]:
        return []  # no names claimed: the bridge never conflicts at registration

    def collect(self) -> Iterator[Metric]:
        own = {name for name in REGISTRY._names_to_collectors}
        for family in prometheus_client.REGISTRY.collect():
            if family.name.startswith("t1_") and family.name not in own:
                yield family


REGISTRY.register(_DefaultRegistryBridge())  # type: ignore[arg-type]
