"""Where each service's requests go, built once per policy: every request looks it up.

A service's route table maps each client route it serves to its runtime's path; its
native routes are those its runtime serves through an API of its own (piper's
``/synthesize``: the body reshaped, the answer relabelled), applied only where the route
goes to the path the adapter names for it, not where a policy's ``routes:`` moved it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from service.adapters.base import NativeRoute
from service.errors import InvalidRequest, ModelNotFound
from service.live.leases import Routed
from service.policy import Policy
from service.policy.routes import adapter_routes
from service.supervisor.launch import adapter_for


@dataclass(frozen=True, slots=True)
class RouteTable:
    """One policy's routing: which service serves a model, at which runtime path."""

    policy: Policy
    routes: Mapping[str, Mapping[str, str]]
    natives: Mapping[str, Mapping[str, NativeRoute]]

    @classmethod
    def of(cls, policy: Policy) -> RouteTable:
        return cls(policy, route_tables(policy), native_routes(policy))

    def resolve(self, model: str, route: str) -> Routed:
        """The service that serves ``model`` and its runtime's path for ``route``; 404 if
        no service serves the model, 400 if its service does not serve the route."""
        name = self.policy.service_for_model(model)
        if name is None:
            raise ModelNotFound(f"model {model!r} is not served here; see GET /v1/models")
        spec = self.policy.services[name]
        path = self.routes[name].get(route)
        if path is None:
            raise InvalidRequest(
                f"model {model!r} is a {spec.kind} model and does not serve {route} "
                f"(service {name!r}; its policy's routes: key can add it)"
            )
        return Routed(name, path, spec.set_params.get(model), self.natives[name].get(route))


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
