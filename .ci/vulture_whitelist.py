"""Names the dead-code check (vulture, in .ci/run) must not report: each is called by a framework or read
by a library, not by T1's own code. A name goes here only with the reason beside it; dead code is removed."""

# ruff: noqa
# mypy: ignore-errors
_ = object()

# pydantic: the model configuration and model validators are called by pydantic.
model_config
_._provider_configured, _._trainer_can_score_the_sampler, _._files_when_enabled, _._demos_for_sft, _._best_round_kept, _._index_in_range
_._http_url, _._one_kind, _._trainable_endpoints, _._harness_samples_as_the_trainer_scores, _._warm_start_sets_known, _._shortcuts_need_curriculum, _._addresses, _._trainer_address, _._ptx_pattern

# asyncssh server, session and client callbacks (t1/sandbox/local/local_server.py, t1/sandbox/ssh/: ssh_sandbox.py,
# ssh_shell.py, terminal.py) and their required parameters.
_.connection_made, _.connection_lost, _.pty_requested, _.shell_requested, _.exec_requested
_.subsystem_requested, _.session_started, _.terminal_size_changed, _.data_received, _.pause_writing
_.resume_writing, _.begin_auth, _.public_key_auth_supported, _.validate_public_key, _.session_requested
term_modes, pixheight, pixwidth, datatype

# pytest: a conftest hook (tests/conftest.py groups the tests of shared session fixtures on one xdist worker).
pytest_collection_modifyitems

# grpc: server interceptor hook. prometheus_client: collector hook. logging: Formatter.converter.
_.intercept_service
# uvicorn: Server.should_exit is read by its serve loop (tests/inference/openai_standin.py stops it so).
_.should_exit
_.describe
_.converter

# vLLM loads the worker extension by its qualified name (worker_extension_cls) and calls its methods.
T1WorkerExtension
_.t1_refresh_moe_kernels

# transformers' cache-layer interface (CacheLayerMixin), called by its Cache and mask code: T1's KV-slot
# layers (t1/inference/server/kv_slots.py, slot_batch.py) implement it.
_.is_croppable, _.lazy_initialization, _.get_mask_sizes, _.get_max_length
# Hugging Face config fields a test sets so that DynamicCache makes sliding-window layers.
_.sliding_window, _.layer_types

# Attributes set for a library to read: tokenizers' pre_tokenizer, tarfile's TarInfo owner fields,
# Hugging Face config fields (use_cache, intermediate_size).
_.pre_tokenizer, _.whitespace_split, _.chat_template
_.gid, _.gname, _.uname
_.use_cache, _.intermediate_size

# Counters kept for people (status pages, logs, dataclasses.asdict in tests and bench reports).
_.health_failures, health_failures, _.render_errors, _.sampled_tokens, _.prefilled_tokens
num_sequences

# The spool's frame format documents its bound beside the header (t1/trajectory/spool_files.py).
MAX_FRAME_BYTES

# pytest: module markers, autouse fixtures, and vLLM stand-in fields that mirror the real engine's types.
pytestmark, _one_torch_thread, FINAL_ONLY, decoded_token, cumulative_logprob, stop_reason, special_tokens
# pytest: tests imported to be collected a second time with another fixture (tests/docker/test_docker_reward_integrity.py).
test_attack_scores_as_an_honest_failure, test_honest_attempts, test_git_runs_no_program_the_agents_repository_names
test_harbor_pytest_loads_nothing_the_agent_planted, test_task_environment_into_agent_dirs_runs_nothing_planted
test_a_forged_count_is_bounded_by_the_test_files, test_the_artifact_pack_cannot_be_laundered_into_an_infra_error
_.__class__


# pydantic validators, StrEnum members chosen by value from config, selenium option attributes.
_._pages_fit, _._storage_fits, WANDB, _.binary_location
# transformers' attention-function signature (t1/trainer/attention.py ignores the dense mask by design).
attention_mask
# Public surface read by docs and callers outside the package (SshSandbox.separates_verifier).
_.separates_verifier
# Task fields parsed for the record: Harbor's allowed_hosts (refused by name), an artifact's destination
# (a host-side path under a trial's artifacts folder; T1 keeps no per-attempt artifact folder yet, so there
# is nothing to place it under), TB1's run_tests_in_same_shell (the verifier
# always gets its own shell; see docs/security.md).
_.allowed_hosts, _.destination, _.same_shell
# tokenizers.Tokenizer's normalizer, set on the Qwen tokenizer (t1/model/qwen_tokenizer.py) and read by the library.
_.normalizer
# vLLM's stat logger surface (t1/inference/server/vllm_backend.py KvGauge): vLLM calls these by name with these
# arguments; the stand-in's SchedulerStats mirrors vLLM's fields.
engine_index, iteration_stats, mm_cache_stats, engine_idx, _.log_engine_initialized, _.record_sleep_state, is_awake
num_running_reqs, num_waiting_reqs
