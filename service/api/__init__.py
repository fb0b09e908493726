"""HTTP routers: ``openai`` (/v1), ``admin`` (/api, /healthz), ``ui`` (the dashboard)."""
