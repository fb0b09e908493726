"""llama-swap's routing (groups, matrix, scheduler priorities) as residency and priority."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from service.importers.llamaswap.matrix_dsl import Combination, DslError, expand_sets
from service.importers.llamaswap.text import no_equivalent, show

PRIORITY_SWAP, PRIORITY_TOGETHER, PRIORITY_PERSISTENT = 100, 200, 300
BAND = 100  # room for the fifo offsets inside a band
MAX_BAND = 900
LONE = "llama-swap: one model at a time"
GROUP_KEYS = {"swap", "exclusive", "persistent", "members"}


@dataclass
class Placement:
    residency: str
    priority: int
    why: str
    priority_why: str | None = None
    protect: str | None = None
    notes: list[str] = field(default_factory=list)


class Routing:
    """Reads a config's routing once; ``placement(model_id)`` is each model's outcome.

    llama-swap decides what runs together by rules: the ``group`` router's ``swap`` /
    ``exclusive`` / ``persistent`` flags, or the ``matrix`` router's allowed combinations
    and eviction costs. vramd decides by memory: whatever fits in the device budget runs, and
    residency and priority say who yields when it does not. So each rule becomes the
    residency and priority that keeps its intent, and a comment says what was decided and
    what has no equivalent.

    Where the rules live: the current format puts them under ``routing.router`` (``use:
    group | matrix``, ``settings.groups`` / ``settings.matrix``) and request order under
    ``routing.scheduler`` (``use: fifo``, ``settings.fifo.priority``); older configs have
    top-level ``groups:`` or ``matrix:``, which llama-swap still reads the same way.

    Priorities, 0..1000 in vramd: the placement gives a band (one model at a time 100, run
    together 200, persistent 300; a matrix's eviction costs 100, 200, ... in their order),
    and fifo priorities add 0..99 inside it, in their order, so both orders are kept.
    """

    def __init__(self, config: Mapping[str, Any]) -> None:
        self.config = config
        # a disabled model is left out of the policy, so routing decides nothing for it
        self.models = {
            str(m)
            for m, raw in config["models"].items()
            if not (isinstance(raw, dict) and raw.get("disabled") is True)
        }
        self.notes: list[str] = []
        self.placements: dict[str, Placement] = {}
        routing = config.get("routing")
        if routing is not None and not isinstance(routing, dict):
            self.notes.append(no_equivalent("routing", routing, "not a mapping"))
            routing = None
        routing = routing or {}
        for key in set(routing) - {"router", "scheduler"}:
            self.notes.append(
                no_equivalent(f"routing.{key}", routing[key], "not a llama-swap routing key")
            )
        self._router(_mapping(routing.get("router"), "routing.router", self.notes))
        self._scheduler(_mapping(routing.get("scheduler"), "routing.scheduler", self.notes))

    def placement(self, model_id: str) -> Placement:
        return self.placements.setdefault(model_id, Placement("on-demand", PRIORITY_SWAP, LONE))

    # ------------------------------------------------------------ router

    def _router(self, router: dict[str, Any]) -> None:
        settings = _mapping(router.get("settings"), "routing.router.settings", self.notes)
        for key in set(router) - {"use", "settings"}:
            self.notes.append(
                no_equivalent(f"routing.router.{key}", router[key], "not a llama-swap key")
            )
        for key in set(settings) - {"groups", "matrix"}:
            self.notes.append(
                no_equivalent(
                    f"routing.router.settings.{key}", settings[key], "not a llama-swap key"
                )
            )
        groups = self._source("groups", settings)
        matrix = self._source("matrix", settings)
        use = router.get("use")
        if use is None:
            use = "matrix" if matrix is not None and groups is None else "group"
        elif use not in ("group", "matrix"):
            self.notes.append(
                no_equivalent("routing.router.use", use, "llama-swap routers are group and matrix")
            )
            use = "group"
        else:
            self.notes.append(f"llama-swap: routing.router.use: {use} (the {use} router, below)")
        if use == "matrix":
            if groups is not None:
                self.notes.append(f"llama-swap: {groups[0]} is not used: the router is matrix")
            if matrix is not None:
                self._matrix(*matrix)
        else:
            if matrix is not None:
                self.notes.append(f"llama-swap: {matrix[0]} is not used: the router is group")
            if groups is not None:
                self._groups(*groups)
            self._default_group(groups is not None)

    def _source(self, key: str, settings: dict[str, Any]) -> tuple[str, Any] | None:
        """Where ``groups`` / ``matrix`` is: ``routing.router.settings`` or the old top level."""
        current, legacy = settings.get(key), self.config.get(key)
        if current is not None and legacy is not None:
            self.notes.append(
                f"llama-swap: both {key} and routing.router.settings.{key} are set, which "
                f"llama-swap refuses; routing.router.settings.{key} is used, {key} ignored"
            )
        if current is not None:
            return f"routing.router.settings.{key}", current
        if legacy is not None:
            return key, legacy
        return None

    # ------------------------------------------------------------ groups

    def _groups(self, where: str, groups: Any) -> None:
        if not isinstance(groups, dict):
            self.notes.append(no_equivalent(where, groups, "not a mapping"))
            return
        grouped = {
            str(m) for g in groups.values() if isinstance(g, dict) for m in g.get("members") or []
        }
        others = len(groups) > 1 or bool(self.models - grouped)
        for name, group in groups.items():
            at = f"{where}.{name}"
            if not isinstance(group, dict):
                self.notes.append(no_equivalent(at, group, "not a mapping"))
                continue
            swap = group.get("swap", True) is not False
            exclusive = group.get("exclusive", True) is not False
            persistent = group.get("persistent", False) is True
            protect = None
            if persistent and swap:
                residency, priority, protect = "on-demand", PRIORITY_PERSISTENT, "never"
            elif persistent:
                residency, priority = "pinned", PRIORITY_PERSISTENT
            elif swap:
                residency, priority = "on-demand", PRIORITY_SWAP
            else:
                residency, priority = "warm", PRIORITY_TOGETHER
            members = [str(m) for m in group.get("members") or []]
            self.notes.append(
                f"llama-swap: {at} (swap: {str(swap).lower()}, exclusive: "
                f"{str(exclusive).lower()}, persistent: {str(persistent).lower()}, members: "
                f"{', '.join(members) or 'none'}) -> {residency}, priority {priority}"
                + (", protect: never" if protect else "")
            )
            if swap and len(members) > 1:
                self.notes.append(
                    no_equivalent(
                        f"{at}.swap",
                        True,
                        "vramd runs members side by side while they fit; equal on-demand "
                        "priorities evict each other when memory is short",
                    )
                )
            if exclusive and others:
                self.notes.append(
                    no_equivalent(
                        f"{at}.exclusive",
                        True,
                        "a member's load unloads all but persistent groups; vramd unloads "
                        "others only when memory is short",
                    )
                )
            elif not exclusive:
                self.notes.append(
                    f"llama-swap: {at}.exclusive: false (loading a member leaves other groups "
                    "loaded) is what vramd does anyway while memory lasts"
                )
            if persistent and swap:
                self.notes.append(
                    f"llama-swap: {at}.persistent: true with swap: true -> on-demand, protect: "
                    "never: members still replace each other (equal priority); lower "
                    "priorities never evict them"
                )
            elif persistent:
                self.notes.append(
                    f"llama-swap: {at}.persistent: true -> pinned, which vramd also "
                    "loads at start (residency: warm with priority 1000 loads on first request)"
                )
            for key in set(group) - GROUP_KEYS:
                self.notes.append(no_equivalent(f"{at}.{key}", group[key], "not a llama-swap key"))
            for member in members:
                if member not in self.models:
                    self.notes.append(f"llama-swap: group {name} names unknown model {member}")
                elif member in self.placements:
                    self.notes.append(
                        f"llama-swap: {member} is in more than one group; kept in the first"
                    )
                else:
                    self.placements[member] = Placement(
                        residency, priority, f"llama-swap group {name}", protect=protect
                    )

    def _default_group(self, any_groups: bool) -> None:
        ungrouped = sorted(self.models - set(self.placements))
        if any_groups and ungrouped:
            self.notes.append(
                f"llama-swap: {', '.join(ungrouped)} in no group: llama-swap's (default) group "
                f"(swap, exclusive) -> on-demand, priority {PRIORITY_SWAP}"
            )

    # ------------------------------------------------------------ matrix

    def _matrix(self, where: str, matrix: Any) -> None:
        if not isinstance(matrix, dict):
            self.notes.append(no_equivalent(where, matrix, "not a mapping"))
            return
        for key in set(matrix) - {"vars", "evict_costs", "sets"}:
            self.notes.append(no_equivalent(f"{where}.{key}", matrix[key], "not a llama-swap key"))
        variables = {
            str(k): str(v)
            for k, v in _mapping(matrix.get("vars"), f"{where}.vars", self.notes).items()
        }
        self.notes.append(
            f"llama-swap: {where}: the matrix router; vramd runs any combination that fits in "
            "the device budget, so its sets become comments and its evict_costs priorities"
        )
        if variables:
            shown = ", ".join(f"{k}={v}" for k, v in variables.items())
            self.notes.append(f"llama-swap: {where}.vars: {shown} (short names for the sets)")

        def resolve(ident: str) -> str | None:
            model = variables.get(ident, ident)
            return model if model in self.models else None

        partners = self._matrix_sets(where, matrix.get("sets"), resolve)
        costs = self._evict_costs(where, matrix.get("evict_costs"), resolve)
        levels = sorted({1, *(cost for cost, _ in costs.values())})
        if len(levels) > MAX_BAND // BAND:
            self.notes.append(
                f"llama-swap: {where}.evict_costs has more than {MAX_BAND // BAND} levels; "
                f"the highest share priority {MAX_BAND}"
            )
        bands = {cost: min(BAND * (rank + 1), MAX_BAND) for rank, cost in enumerate(levels)}
        if costs:
            order = ", ".join(f"{cost} -> {bands[cost]}" for cost in levels)
            self.notes.append(
                f"llama-swap: {where}.evict_costs (higher: evicted later) -> priority in the "
                f"same order: {order}; vramd also prefers evicting what reloads fast"
            )
        for model in sorted(self.models):
            cost, key = costs.get(model, (1, None))
            why = f"llama-swap: evict_costs {key}: {cost}" if key else "llama-swap: evict cost 1"
            placement = Placement("on-demand", bands[cost], f"llama-swap {where}", why)
            together = partners.get(model)
            if together is None:
                placement.notes.append(
                    f"llama-swap: {model} is in no matrix set, so llama-swap runs it alone; "
                    "vramd runs it beside others while they fit"
                )
            else:
                sets = f"set{'s' if len(together[0]) > 1 else ''} {', '.join(together[0])}"
                beside = ", ".join(sorted(together[1]))
                placement.notes.append(
                    f"llama-swap: matrix {sets}: it may run beside {beside}"
                    if beside
                    else f"llama-swap: matrix {sets}: it runs alone"
                )
            self.placements[model] = placement

    def _matrix_sets(
        self, where: str, sets: Any, resolve: Any
    ) -> dict[str, tuple[list[str], set[str]]]:
        """Per model: the sets it is in and the models those sets let run beside it."""
        sets = _mapping(sets, f"{where}.sets", self.notes)
        try:
            expanded = expand_sets({str(k): str(v) for k, v in sets.items()}, resolve)
        except DslError as exc:
            self.notes.append(f"llama-swap: {where}.sets cannot be read ({exc}); left out")
            return {}
        partners: dict[str, tuple[list[str], set[str]]] = {}
        for name, combinations in expanded.items():
            self.notes.append(
                f"llama-swap: {where}.sets.{name}: {sets[name]} allows "
                f"{_combinations(combinations)} loaded together"
            )
            for combination in combinations:
                for model in combination:
                    names, others = partners.setdefault(model, ([], set()))
                    if name not in names:
                        names.append(name)
                    others |= combination - {model}
        return partners

    def _evict_costs(self, where: str, raw: Any, resolve: Any) -> dict[str, tuple[int, str]]:
        costs: dict[str, tuple[int, str]] = {}
        for key, cost in _mapping(raw, f"{where}.evict_costs", self.notes).items():
            model = resolve(str(key))
            if model is None or not isinstance(cost, int) or isinstance(cost, bool) or cost <= 0:
                self.notes.append(
                    no_equivalent(
                        f"{where}.evict_costs.{key}", cost, "not a positive cost of a var or model"
                    )
                )
                continue
            costs[model] = (cost, str(key))
        return costs

    # --------------------------------------------------------- scheduler

    def _scheduler(self, scheduler: dict[str, Any]) -> None:
        where = "routing.scheduler"
        for key in set(scheduler) - {"use", "settings"}:
            self.notes.append(
                no_equivalent(f"{where}.{key}", scheduler[key], "not a llama-swap key")
            )
        use = scheduler.get("use", "fifo")
        if use != "fifo":
            self.notes.append(no_equivalent(f"{where}.use", use, "llama-swap's scheduler is fifo"))
            return
        if "use" in scheduler:
            self.notes.append(
                f"llama-swap: {where}.use: fifo: requests wait in arrival order; so do vramd's, "
                "per service"
            )
        settings = _mapping(scheduler.get("settings"), f"{where}.settings", self.notes)
        for key in set(settings) - {"fifo"}:
            self.notes.append(
                no_equivalent(f"{where}.settings.{key}", settings[key], "not a llama-swap key")
            )
        fifo = _mapping(settings.get("fifo"), f"{where}.settings.fifo", self.notes)
        for key in set(fifo) - {"priority"}:
            self.notes.append(
                no_equivalent(f"{where}.settings.fifo.{key}", fifo[key], "not a llama-swap key")
            )
        at = f"{where}.settings.fifo.priority"
        given: dict[str, int] = {}
        for model, value in _mapping(fifo.get("priority"), at, self.notes).items():
            if (
                str(model) not in self.models
                or not isinstance(value, int)
                or isinstance(value, bool)
            ):
                self.notes.append(
                    no_equivalent(f"{at}.{model}", value, "not a model id and an integer")
                )
            else:
                given[str(model)] = value
        if not given:
            return
        levels = sorted({0, *given.values()})
        step = 10 if len(levels) <= 10 else (BAND - 1) / (len(levels) - 1)
        offsets = {value: round(rank * step) for rank, value in enumerate(levels)}
        order = ", ".join(f"{value} -> +{offsets[value]}" for value in levels)
        self.notes.append(
            f"llama-swap: {at}: higher is served first (default 0) -> added to each service's "
            f"priority in the same order: {order} (vramd serves the highest priority first)"
        )
        for model in sorted(self.models):
            value = given.get(model, 0)
            placement = self.placement(model)
            placement.priority += offsets[value]
            why = f"fifo priority {value} (+{offsets[value]})"
            placement.priority_why = (
                f"{placement.priority_why}; {why}"
                if placement.priority_why
                else f"llama-swap: {why}"
            )


def _mapping(value: Any, where: str, notes: list[str]) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        notes.append(no_equivalent(where, value, "not a mapping"))
        return {}
    return value


def _combinations(combinations: list[Combination]) -> str:
    return show(" | ".join("[" + ", ".join(sorted(c)) + "]" for c in combinations), limit=120)
