"""Where each service's requests go, built once per policy: every request looks it up.

A service's route table maps each client route it serves to its runtime's path; its
native routes are those its runtime serves through an API of its own (piper's
``/synthesize``: the body reshaped, the answer relabelled), applied only where the route
goes to the path the adapter names for it, not where a policy's ``routes:`` moved it.
"""

from __future__ import annotations

from collections.abc import Mapping

from service.adapters.base import NativeRoute
from service.live.runtimes import adapter_for
from service.policy import Policy
from service.policy.routes import adapter_routes


def route_tables(policy: Policy) -> dict[str, Mapping[str, str]]:
    """Each service's route table, built once per policy: every request looks one up."""
    return {name: spec.route_table() for name, spec in policy.services.items()}


def native_routes(policy: Policy) -> dict[str, Mapping[str, NativeRoute]]:
    """Each service's routes that its runtime serves through an API of its own (piper's):
    those it serves at the path its adapter names for them, not where a policy moved them."""
    shapes: dict[str, Mapping[str, NativeRoute]] = {}
    for name, spec in policy.services.items():
        table = spec.route_table()
        defaults = adapter_routes(spec.adapter_name, spec.command)
        shapes[name] = {
            route: native
            for route, native in adapter_for(spec).native_routes.items()
            if route in table and table[route] == defaults.get(route)
        }
    return shapes
