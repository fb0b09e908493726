"""Which llama-swap keys the importer knows, and why those with no equivalent have none.

A key in neither the mapped set nor the notes table is reported as not a llama-swap
key, so a typo in the input is said, not silently dropped.
"""

from __future__ import annotations

TOP_LEVEL_NOTES = {
    "logLevel": "set VRAMD_LOG_LEVEL for vramd serve",
    "logRequests": "set VRAMD_LOG_LEVEL for vramd serve",
    "logTimeFormat": "vramd's log format is fixed",
    "logToStdout": "vramd keeps each runtime's output: GET /api/services/NAME/logs",
    "metricsMaxInMemory": "vramd keeps events and samples in SQLite",
    "captureBuffer": "vramd does not capture request bodies",
    "store": "vramd keeps its state in server.database (SQLite)",
    "ui": "vramd's dashboard has no settings",
    "performance": "vramd samples memory every device.sample_interval",
    "sendLoadingState": "vramd marks cold starts with the X-Vramd-Cold-Start header",
    "includeAliasesInList": "vramd lists every model name in /v1/models",
    "startPort": "vramd gives each instance a free loopback port as ${PORT}",
    "profiles": "vramd has no runtime-switched model-name pins; give names to services",
    "peers": "vramd runs local runtimes only",
    "upstream": "vramd passes /upstream/{service}/{path} through as is; it has no settings",
}
TOP_LEVEL_KEYS = {
    "healthCheckTimeout",
    "globalTTL",
    "unloadTimeout",
    "macros",
    "apiKeys",
    "models",
    "routing",
    "groups",
    "matrix",
    "hooks",
} | set(TOP_LEVEL_NOTES)
LISTING = "vramd lists model names only"
MODEL_NOTES = {
    "cmdStop": "vramd stops the process group: SIGTERM, then SIGKILL after stop_timeout",
    "name": LISTING,
    "description": LISTING,
    "metadata": LISTING,
    "sendLoadingState": "vramd marks cold starts with the X-Vramd-Cold-Start header",
    "timeouts": "vramd has startup_timeout and queue.timeout",
    "unlisted": "vramd lists every model name in /v1/models",
    "healthCheckTimeout": "llama-swap uses the global healthCheckTimeout for every model",
}
MODEL_KEYS = {
    "cmd",
    "proxy",
    "aliases",
    "env",
    "checkEndpoint",
    "ttl",
    "unloadTimeout",
    "useModelName",
    "concurrencyLimit",
    "macros",
    "filters",
    "capabilities",
    "disabled",
} | set(MODEL_NOTES)
