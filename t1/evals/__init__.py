"""Eval statistics: what an attempt came to, and the numbers a report gives for a set of attempts.

- results.py: AttemptOutcome (a finished attempt: status, reward, resolved, turns, segments), TaskTally (one
  task's counts), JobSummaryValues (an eval job's summary: resolve rate, mean reward, pass@k, infra errors)
  computed in one place, summary_of(tallies) (the job store's tallies or tallies_of(outcomes): summarize); pass_at_k.
- stats.py: the report's statistics: solve rate with a 95% Wilson score interval (wilson_interval),
  RateSummary (rate_summary), per-family rows (task_family, by_family, family_lookup), intervals_overlap,
  turns and segments per episode (spread, episode_shape: median, p90, min, max); EvalSummary (eval_summary): the
  one summary of a job a run reports (as_dict: report.json's layout).

Pure functions over finished attempts; infra errors are counted apart and never enter a rate.
"""
