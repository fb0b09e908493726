"""Forwarding one leased request to one runtime, in the client's dialect.

forward.py   ProxyResponse: lease, send (again if never sent), relay the answer
request.py   ClientRequest, ProxyConfig, Translator: what a router hands the proxy
body.py      find_model, with_params, request_shape: what a client's body says, rewritten
watchers.py  around one exchange: client hang-up, runtime silence, delayed ACKs
dialects.py  the client's API dialect (OpenAI, Responses, Anthropic, Ollama): errors
message_start.py  MessageStart: the opening event an Anthropic stream lacked, put back
successor.py      relay_to_successor: a request the old daemon forwards after a hand-over
usage.py     what an answer says it used: tokens, images, audio seconds
"""
