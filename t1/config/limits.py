"""Bounds on what a client may ask of a T1 service; every request field is checked against them."""

from __future__ import annotations

from pydantic import Field, model_validator

from t1.config.base import Section


class RequestLimits(Section):
    """Request bounds, enforced at the RPC edge with INVALID_ARGUMENT naming the field."""

    max_attempts_per_task: int = Field(1000, ge=1, description="Largest `attempts` of one eval job.")
    max_attempts_per_job: int = Field(100_000, ge=1, description="Largest tasks x attempts of one eval job.")
    max_job_concurrency: int = Field(1024, ge=1, description="Largest `concurrency` of one eval job.")
    max_timeout_multiplier: float = Field(100.0, gt=0, description="Largest `timeout_multiplier` of one eval job.")
    max_pass_at_k: int = Field(16, ge=1, description="pass@k is reported for k = 1 .. min(attempts, this).")
    max_name_chars: int = Field(256, ge=1, description="Longest job name, task id or endpoint in a request.")
    max_path_chars: int = Field(4096, ge=1, description="Longest task folder or set name in a request.")
    max_instruction_chars: int = Field(262_144, ge=1, description="Longest task instruction an eval job may run.")
    max_list_items: int = Field(10_000, ge=1, description="Most task ids or endpoints listed in one request.")
    list_page_size: int = Field(100, ge=1, description="Jobs per ListJobs page when the request gives no limit.")
    max_list_page_size: int = Field(1000, ge=1, description="Largest ListJobs page a request may ask for.")
    max_abs_reward: float = Field(1e6, gt=0, description="Largest |reward| the trainer accepts in a trajectory.")
    max_active_jobs: int = Field(32, ge=1, description="Most eval jobs queued or running at once; another submission "
                                 "is RESOURCE_EXHAUSTED until one ends.")
    max_jobs_db_mb: int = Field(1024, ge=1, description="Largest eval job database (jobs.db and its log) that still "
                                "takes new jobs; past it a submission is RESOURCE_EXHAUSTED.")
    max_request_mb: int = Field(4, ge=1, description="Largest request body of a control call (not trajectory "
                                "pushes or generation, which have server.max_message_mb).")

    @model_validator(mode="after")
    def _pages_fit(self) -> RequestLimits:
        if self.list_page_size > self.max_list_page_size:
            raise ValueError(f"limits.list_page_size ({self.list_page_size}) exceeds limits.max_list_page_size "
                             f"({self.max_list_page_size})")
        return self
