"""The operator console: a small server-rendered web app (Starlette, Jinja2, uvicorn)."""
