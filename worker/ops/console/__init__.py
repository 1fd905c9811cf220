"""The operator console: a small server-rendered web app (Starlette, Jinja2, uvicorn).

app.py          the app (`timer-service console`): its routes, read-only unless
                TIMER_CONSOLE_ACTIONS
auth.py         the door: every request authenticated, every form post with its CSRF token
base.py         what every page shares: the Console, rendering, the checked form, the audit line
views.py        the reading pages: the overview, the search, a tenant's timers, a timer
tenant_views.py the tenants page: every tenant, by name or by pending timers, by prefix
dlq_views.py    the DLQ pages: the listing and its filter, one entry, its replay, the bulk actions
api.py          the JSON API (/api/v1/...): every page's data, read-only, as the CLI's --json
actions.py      the actions on a timer or a tenant (cancel, reschedule, fire now, pause, resume)
bulk.py         the bulk actions on the timers a tenant's filter selects: offered, confirmed once, sent
charts.py       line charts as inline SVG, drawn on the server
templates/      the Jinja2 templates of those pages
"""
