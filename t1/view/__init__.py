"""`t1 view`: a read-only local web viewer of a run directory (curves, episodes, tokens); see server.py.

Modules:
- server.py: the Starlette app: pages rendered with Jinja2, charts drawn by plotly.js
- index.py: the index of a run directory: episode rows, run-log records, trainer steps, eval jobs
- sources.py: read-only readers of the run log, the spool, the trainer buffer, eval jobs, demos
- episodes.py: episode rows and the episodes table's query (pure)
- curves.py: the run page's data: curves, the stage timeline, eval comparisons (pure)
- learning_png.py: the run's learning curves as one PNG beside its run log
- tokens.py: the token view of a segment: id, text, role, logprob, version, routing coverage
- transcripts.py: transcripts parsed back into turns
- vocab.py: the tokenizer as the token view needs it
"""
