"""`t1 view`'s web app: a Starlette app over a RunIndex, pages rendered with Jinja2, charts drawn by plotly.js.

Routes: `/` the run (curves, stage timeline, eval jobs), `/episodes` the table (filters, sort, pages),
`/episodes/{id}` one episode (turns, verifier, token view), `/groups/{id}` a group's attempts side by
side, `/assets/...` the stylesheet and scripts. Every asset ships in the installed packages (ours and
plotly's bundled plotly.min.js): no CDN, nothing fetched at run time. Requests are answered from the
index, which each request brings up to date at most once a second (a live run is followed).

A request whose Host header is not one of the viewer's names (localhost, the loopback addresses,
the bound address, `--allow-host`) is refused with 400: a page on another site whose name a
DNS-rebinding attack points at 127.0.0.1 cannot read the run. Every response carries a Content
Security Policy that runs only the viewer's own scripts (no inline script, nothing from elsewhere),
so text from a run that escaped escaping could still not run.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Sequence
from importlib import resources
from typing import Any

from jinja2 import Environment, PackageLoader, select_autoescape
from markupsafe import Markup
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import HTMLResponse, PlainTextResponse, Response
from starlette.routing import Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from t1.view import curves
from t1.view.episodes import EpisodeQuery, EpisodeRow, SortKey, group_advantages, page_of, sort_rows
from t1.view.index import RunIndex
from t1.view.learning_png import PNG_NAME
from t1.view.sources import read_locator
from t1.view.tokens import TokenRole, cells_html, token_cells
from t1.view.transcripts import read_transcript, show_controls
from t1.view.vocab import Vocab

_ASSETS = {"view.css": "text/css", "view.js": "text/javascript"}
_CACHE = {"Cache-Control": "max-age=3600"}
LOOPBACK_NAMES = ("localhost", "127.0.0.1", "::1")
CSP = ("default-src 'none'; script-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data:; "
       "connect-src 'self'; font-src 'self' data:; base-uri 'none'; form-action 'self'; frame-ancestors 'none'")
SECURITY_HEADERS = [(b"content-security-policy", CSP.encode()), (b"x-content-type-options", b"nosniff"),
                    (b"referrer-policy", b"no-referrer")]


def host_name(header: str) -> str:
    """The name in a Host header, without its port: `[::1]:80` -> `::1`, `Example:80` -> `example` (pure)."""
    if header.startswith("["):
        return header[1:header.find("]")].lower() if "]" in header else ""
    return header.rsplit(":", 1)[0].lower() if header.count(":") == 1 else header.lower()


class Guard:
    """ASGI middleware: a Host header not among `names` gets 400 (DNS rebinding); every HTTP response carries
    the CSP and its companions."""

    def __init__(self, app: ASGIApp, names: Sequence[str]) -> None:
        self.app = app
        self.names = frozenset(n.lower() for n in names)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        host = next((v.decode("latin-1") for k, v in scope["headers"] if k == b"host"), "")
        if host_name(host) not in self.names:
            refused = PlainTextResponse(f"t1 view does not answer for the host {host!r}: open it as "
                                        f"http://127.0.0.1:PORT/ (or start it with --allow-host NAME)", 400,
                                        headers=dict((k.decode(), v.decode()) for k, v in SECURITY_HEADERS))
            await refused(scope, receive, send)
            return

        async def with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", []), *SECURITY_HEADERS]
            await send(message)

        await self.app(scope, receive, with_headers)


def _plotly_js() -> bytes:
    return (resources.files("plotly") / "package_data" / "plotly.min.js").read_bytes()


def _env() -> Environment:
    env = Environment(loader=PackageLoader("t1.view", "templates"), autoescape=select_autoescape(["html"]),
                      trim_blocks=True, lstrip_blocks=True)
    env.filters["num"] = lambda v, d=3: "" if v is None else (f"{v:.{d}g}" if isinstance(v, float) else str(v))
    env.filters["clock"] = lambda ts: time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(ts))
    env.filters["visible"] = show_controls
    return env


def create_app(index: RunIndex, vocab: Vocab, hosts: Sequence[str] = ()) -> Starlette:
    """The viewer's app; `hosts`: Host header names it answers besides LOOPBACK_NAMES."""
    env = _env()
    plotly = _plotly_js()

    orders: dict[tuple[int, SortKey, bool], list[EpisodeRow]] = {}

    def page(template: str, status: int = 200, **ctx: Any) -> HTMLResponse:
        html = env.get_template(template).render(run_dir=str(index.paths.run_dir), **ctx)
        return HTMLResponse(html, status_code=status)

    def run_page(request: Request) -> Response:
        index.refresh()
        charts = curves.run_charts(index.records, index.steps, index.episodes)
        evals = curves.eval_rows(index.jobs)
        labels, compare = curves.comparison(evals)
        timeline = curves.stage_timeline(index.records)
        total_s = timeline[-1].end_s if timeline else 0.0
        start = next((r for r in index.records if r.get("event") == "start"), {})
        return page("run.html", charts=charts, charts_json=[c.as_json() for c in charts], evals=evals,
                    labels=labels, label_names=curves.LABEL_NAMES, compare=compare, timeline=timeline,
                    total_s=total_s, name=start.get("name", ""), num_episodes=len(index.episodes),
                    num_steps=len(index.steps), records=len(index.records),
                    has_png=(index.paths.run_dir / PNG_NAME).is_file())

    def episodes_page(request: Request) -> Response:
        index.refresh()
        try:
            q = EpisodeQuery.from_params(request.query_params)
        except ValueError as exc:
            return page("error.html", status=400, message=str(exc))
        key = (index.generation, q.sort, q.descending)
        view = orders.get(key)
        if view is None:  # the table's orders are kept until the index changes
            view = sort_rows(index.episodes, q.sort, q.descending)
            for old in [k for k in orders if k[0] != index.generation]:
                orders.pop(old, None)
            orders[key] = view
        result = page_of(view, q)
        params = {k: v for k, v in request.query_params.items() if k not in ("page", "sort", "order")}
        return page("episodes.html", result=result, q=q, facets=index.facets(), params=params,
                    sort_keys=[k.value for k in SortKey])

    def episode_page(request: Request) -> Response:
        index.refresh()
        row = index.episode(request.path_params["episode_id"])
        if row is None:
            return page("error.html", status=404, message=f"no episode {request.path_params['episode_id']!r} "
                                                           f"in {index.paths.run_dir}")
        try:
            trajectory = read_locator(row.locator) if row.locator is not None else None
        except (FileNotFoundError, KeyError):
            # the spool file was acknowledged and deleted since the index saw it: the trainer's buffer has it now
            index.refresh(force=True)
            row = index.episode(row.id) or row
            trajectory = read_locator(row.locator) if row.locator is not None else None
        segments: list[dict[str, Any]] = []
        if trajectory is not None:
            for i, seg in enumerate(trajectory.segments):
                cells = token_cells(seg, vocab.decode, vocab.eot_ids, vocab.special_ids)
                tally = Counter(c.role for c in cells)
                counts = {role: tally.get(role, 0) for role in TokenRole}
                segments.append({"index": i, "html": Markup(cells_html(cells)), "num_tokens": len(cells),
                                 "turns": seg.turns, "counts": counts,
                                 "has_routing": seg.routing is not None})
        transcript_path = index.transcript_path(row)
        transcript = read_transcript(transcript_path) if transcript_path else None
        turn_rewards = dict(enumerate(span.reward for seg in segments for span in seg["turns"]))
        return page("episode.html", row=row, trajectory=trajectory, segments=segments, transcript=transcript,
                    turn_rewards=turn_rewards,
                    transcript_path=transcript_path.relative_to(index.paths.run_dir) if transcript_path else None,
                    roles=list(TokenRole), has_vocab=vocab.tokenizer is not None)

    def group_page(request: Request) -> Response:
        index.refresh()
        group_id = request.path_params["group_id"]
        rows = index.group(group_id)
        if not rows:
            return page("error.html", status=404, message=f"no group {group_id!r} in {index.paths.run_dir}")
        scored = [r for r in rows if not r.infra_error]
        adv = dict(zip((r.id for r in scored), group_advantages([r.reward for r in scored]), strict=True))
        attempts = [{"row": r, "advantage": adv.get(r.id),
                     "transcript": read_transcript(p) if (p := index.transcript_path(r)) else None}
                    for r in rows]
        return page("group.html", group_id=group_id, attempts=attempts)

    def asset(request: Request) -> Response:
        name = request.path_params["name"]
        if name == "plotly.min.js":
            return Response(plotly, media_type="text/javascript", headers=_CACHE)
        if name not in _ASSETS:
            return PlainTextResponse(f"no asset {name!r}", status_code=404)
        return Response((resources.files("t1.view") / "assets" / name).read_bytes(), media_type=_ASSETS[name])

    def learning_png(request: Request) -> Response:
        path = index.paths.run_dir / PNG_NAME
        if not path.is_file():
            return PlainTextResponse(f"{path} is not written yet: the run draws it at its end", status_code=404)
        return Response(path.read_bytes(), media_type="image/png")

    names = sorted({*LOOPBACK_NAMES, *(h.strip("[]") for h in hosts if h not in ("0.0.0.0", "::", ""))})
    return Starlette(middleware=[Middleware(Guard, names=names)],
                     routes=[
        Route("/", run_page),
        Route(f"/{PNG_NAME}", learning_png),
        Route("/episodes", episodes_page),
        Route("/episodes/{episode_id:path}", episode_page),
        Route("/groups/{group_id:path}", group_page),
        Route("/assets/{name}", asset),
    ])
