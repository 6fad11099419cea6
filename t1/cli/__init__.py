"""The entry points: the `t1` client CLI and the thin mains of the three services.

Modules:
- main.py: `t1`, the client CLI; each command group registers itself from its own module
- common.py: `--config FILE` plus `--set a.b=value`, exit 2 on a bad config, 3 on bad state
- coordinator.py: `t1-coordinator`: the control plane (training run, eval jobs, local stack)
- inference.py: `t1-inference`: serve InferenceService over a torch or vllm backend
- trainer.py: `t1-trainer`: serve TrainerService and train
- config_cmd.py: `t1 config check|show`
- eval_cmd.py: `t1 eval submit|watch|list|cancel|report` against a running coordinator
- eval_render.py: eval jobs as tables (rich, Markdown, CSV) and JSON, as pure functions
- model_cmd.py: `t1 model init`: a random-init model folder made locally
- sandbox_cmd.py: `t1 sandbox exec|shell` in a fresh sandbox
- spool_cmd.py: `t1 spool check|repair RUN_DIR`
- tasks_cmd.py: `t1 tasks oracle|verify|validate|synth|decontam`
- view_cmd.py: `t1 view RUN_DIR`: the read-only web viewer on a loopback port
"""
