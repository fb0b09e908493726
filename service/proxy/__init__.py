"""Forwarding one leased request to one runtime, in the client's dialect.

forward.py   ProxyResponse: lease, send (again if never sent), relay the answer
watchers.py  around one exchange: client hang-up, runtime silence, delayed ACKs
dialects.py  the client's API dialect (OpenAI, Responses, Anthropic, Ollama): errors
"""
