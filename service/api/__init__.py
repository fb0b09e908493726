"""FastAPI routers and what they share; they ask the kernel, never a process or a probe.

openai.py    /v1: the OpenAI- and Anthropic-style routes, proxied to a leased runtime
upstream.py  runtime-native paths (/upstream/{service}/...), proxied the same way
ollama.py    the Ollama listener's routes, translated by service.ollama
admin.py     /api and /healthz: services, load/unload, explain, events, windows, policy
metrics.py   GET /metrics: the Prometheus series
router_metrics.py  the vllm:* series a cluster router scores this machine by
exposition.py  Prometheus's text format, written fast
ui.py        the dashboard's static files
auth.py      bearer keys for /v1 and /api
deps.py      what the routers get from the app (the kernel, the settings)
errors.py    exceptions to JSON error bodies, in the client's dialect
"""
