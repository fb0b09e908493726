"""The Kubernetes manifests in deploy/kubernetes are valid and agree with each other.

- every core object (DaemonSet, Service, ConfigMap, Deployment, RBAC) validates against
  the Kubernetes schema in strict mode, so a misspelt or misplaced field fails;
- the custom resources (InferencePool, HTTPRoute) and the endpoint picker's config hold
  together: the pool selects exactly the DaemonSet's pods on vramd's container port, its
  picker reference names the EPP Service and port, the route sends the OpenAI routes the
  picker parses to the pool and the rest of /v1 to the Service, and the picker reads
  vLLM's metric names with the queue, KV-cache and LoRA-affinity scorers and a picker;
- the DaemonSet agrees with the daemon: its probes ask /healthz on the container port,
  which is the policy's server.port; VRAMD_CONFIG points into the ConfigMap's mount and
  VRAMD_DB into the volume at /var/lib/vramd; it runs as uid 10001, not root, in the
  host's pid namespace, with a GPU, and its grace period outlasts the slowest runtime's
  stop; and the ConfigMap's policy loads with vramd's own loader.

Validation is offline: kubernetes-validate ships the schemas.
"""

from __future__ import annotations

from pathlib import Path, PurePosixPath
from typing import Any

import kubernetes_validate  # type: ignore[import-untyped]
import pytest
import yaml

from service.policy import Policy, load_policy
from service.settings import Settings

MANIFESTS = Path(__file__).resolve().parents[2] / "deploy" / "kubernetes"
KUBERNETES_VERSION = "1.30"
CUSTOM_KINDS = {
    ("inference.networking.k8s.io/v1", "InferencePool"),
    ("gateway.networking.k8s.io/v1", "HTTPRoute"),
}
VLLM_METRIC_NAMES = {
    "queuedRequestsSpec": "vllm:num_requests_waiting",
    "runningRequestsSpec": "vllm:num_requests_running",
    "kvUsageSpec": "vllm:kv_cache_usage_perc",
    "loraSpec": "vllm:lora_requests_info",
}
SCORERS = {"queue-scorer", "kv-cache-utilization-scorer", "lora-affinity-scorer"}
SETTLE_TIMEOUT_S = float(Settings.model_fields["settle_timeout"].default)
PICKER_PARSED_PATHS = {"/v1/chat/completions", "/v1/completions", "/v1/embeddings", "/v1/responses"}


def load_objects() -> list[tuple[str, dict[str, Any]]]:
    objects = []
    for path in sorted(MANIFESTS.glob("*.yaml")):
        for document in yaml.safe_load_all(path.read_text(encoding="utf-8")):
            if document is not None:
                objects.append((path.name, document))
    return objects


OBJECTS = load_objects()


def the_one(kind: str, name: str | None = None) -> dict[str, Any]:
    found = [
        obj
        for _, obj in OBJECTS
        if obj["kind"] == kind and (name is None or obj["metadata"]["name"] == name)
    ]
    assert len(found) == 1, f"expected one {kind} {name or ''}, found {len(found)}"
    return found[0]


def container(workload: dict[str, Any], name: str) -> dict[str, Any]:
    containers = workload["spec"]["template"]["spec"]["containers"]
    return next(c for c in containers if c["name"] == name)


def env_value(ctr: dict[str, Any], name: str) -> str:
    return str(next(e["value"] for e in ctr["env"] if e["name"] == name))


def port_number(ctr: dict[str, Any], port_name: str) -> int:
    return int(next(p["containerPort"] for p in ctr["ports"] if p["name"] == port_name))


def mount_path(ctr: dict[str, Any], volume: str) -> PurePosixPath:
    return next(PurePosixPath(m["mountPath"]) for m in ctr["volumeMounts"] if m["name"] == volume)


def volume(workload: dict[str, Any], name: str) -> dict[str, Any]:
    volumes = workload["spec"]["template"]["spec"]["volumes"]
    return next(v for v in volumes if v["name"] == name)


def vramd_policy() -> Policy:
    configmap = the_one("ConfigMap", "vramd-policy")
    return load_policy(configmap["data"]["vramd.yaml"])


def picker_config() -> dict[str, Any]:
    configmap = the_one("ConfigMap", "vramd-epp")
    (text,) = configmap["data"].values()
    config: dict[str, Any] = yaml.safe_load(text)
    return config


def daemonset_container() -> dict[str, Any]:
    return container(the_one("DaemonSet", "vramd"), "vramd")


CORE_OBJECTS = [
    pytest.param(obj, id=f"{file}:{obj['kind']}/{obj['metadata']['name']}")
    for file, obj in OBJECTS
    if (obj["apiVersion"], obj["kind"]) not in CUSTOM_KINDS
]


def test_manifests_hold_the_core_objects_the_pool_and_the_route() -> None:
    kinds = {(obj["apiVersion"], obj["kind"]) for _, obj in OBJECTS}
    assert kinds >= CUSTOM_KINDS
    core_kinds = {kind for _, kind in kinds - CUSTOM_KINDS}
    assert {"DaemonSet", "Service", "ConfigMap", "Deployment"} <= core_kinds


@pytest.mark.parametrize("obj", CORE_OBJECTS)
def test_core_object_validates_against_the_kubernetes_schema_strictly(
    obj: dict[str, Any],
) -> None:
    kubernetes_validate.validate(obj, KUBERNETES_VERSION, strict=True)


def test_strict_validation_rejects_an_unknown_field() -> None:
    service = the_one("Service", "vramd")
    misspelt = {**service, "spec": {**service["spec"], "selectr": {"app": "x"}}}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(misspelt, KUBERNETES_VERSION, strict=True)


def test_configmap_policy_loads_with_the_daemons_loader_and_listens_on_all_interfaces() -> None:
    policy = vramd_policy()
    assert policy.server.host == "0.0.0.0"
    assert policy.server.api_keys and policy.server.admin_keys
    assert policy.services


def test_probes_ask_healthz_on_the_container_port_which_is_the_policys_port() -> None:
    ctr = daemonset_container()
    http_port = port_number(ctr, "http")
    assert http_port == vramd_policy().server.port == 8400
    probes = [ctr[key] for key in ("startupProbe", "readinessProbe", "livenessProbe") if key in ctr]
    assert {"readinessProbe", "livenessProbe"} <= ctr.keys()
    for probe in probes:
        assert probe["httpGet"]["path"] == "/healthz"
        assert probe["httpGet"]["port"] in ("http", http_port)


def test_vramd_config_points_at_the_policy_file_in_the_configmap_mount() -> None:
    daemonset = the_one("DaemonSet", "vramd")
    ctr = daemonset_container()
    config = PurePosixPath(env_value(ctr, "VRAMD_CONFIG"))
    assert config.parent == mount_path(ctr, "policy")
    assert volume(daemonset, "policy")["configMap"]["name"] == "vramd-policy"
    assert config.name in the_one("ConfigMap", "vramd-policy")["data"]


def test_vramd_db_lies_in_the_persistent_volume_mounted_at_var_lib_vramd() -> None:
    daemonset = the_one("DaemonSet", "vramd")
    ctr = daemonset_container()
    data_mount = mount_path(ctr, "data")
    assert data_mount == PurePosixPath("/var/lib/vramd")
    assert PurePosixPath(env_value(ctr, "VRAMD_DB")).parent == data_mount
    assert volume(daemonset, "data")["hostPath"]["type"] == "DirectoryOrCreate"


def test_daemonset_runs_vramd_as_uid_10001_in_the_host_pid_namespace_with_a_gpu() -> None:
    daemonset = the_one("DaemonSet", "vramd")
    pod = daemonset["spec"]["template"]["spec"]
    ctr = daemonset_container()
    assert pod["hostPID"] is True
    assert ctr["securityContext"]["runAsUser"] == 10001
    assert ctr["securityContext"]["runAsNonRoot"] is True
    assert ctr["resources"]["limits"]["nvidia.com/gpu"] >= 1
    assert pod["nodeSelector"]["nvidia.com/gpu.present"] == "true"


def test_grace_period_outlasts_the_slowest_runtime_stop_and_the_settle_barrier() -> None:
    pod = the_one("DaemonSet", "vramd")["spec"]["template"]["spec"]
    slowest_stop_s = max(service.stop_timeout for service in vramd_policy().services.values())
    assert pod["terminationGracePeriodSeconds"] >= max(60, slowest_stop_s + SETTLE_TIMEOUT_S)


def test_service_selects_the_daemonset_pods_on_the_http_port() -> None:
    service = the_one("Service", "vramd")
    pod_labels = the_one("DaemonSet", "vramd")["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"] == pod_labels
    (port,) = service["spec"]["ports"]
    assert port["name"] == "http"
    assert port["port"] == port_number(daemonset_container(), "http")


def test_inference_pool_selects_exactly_the_daemonset_pods_on_the_container_port() -> None:
    pool = the_one("InferencePool", "vramd")
    daemonset = the_one("DaemonSet", "vramd")
    assert pool["apiVersion"] == "inference.networking.k8s.io/v1"
    assert pool["spec"]["selector"] == {
        "matchLabels": daemonset["spec"]["template"]["metadata"]["labels"]
    }
    assert pool["spec"]["targetPorts"] == [{"number": port_number(daemonset_container(), "http")}]


def test_inference_pool_picker_reference_names_the_epp_service_and_its_ext_proc_port() -> None:
    ref = the_one("InferencePool", "vramd")["spec"]["endpointPickerRef"]
    service = the_one("Service", ref["name"])
    epp = container(the_one("Deployment", ref["name"]), "epp")
    service_port = next(p for p in service["spec"]["ports"] if p["port"] == ref["port"]["number"])
    assert port_number(epp, service_port["targetPort"]) == ref["port"]["number"]
    epp_pod_labels = the_one("Deployment", ref["name"])["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"] == epp_pod_labels


def test_endpoint_picker_runs_for_the_pool_with_the_mounted_config() -> None:
    deployment = the_one("Deployment", "vramd-epp")
    epp = container(deployment, "epp")
    args = epp["args"]
    assert args[args.index("--pool-name") + 1] == the_one("InferencePool")["metadata"]["name"]
    config_file = PurePosixPath(args[args.index("--config-file") + 1])
    assert config_file.parent == mount_path(epp, "config")
    assert volume(deployment, "config")["configMap"]["name"] == "vramd-epp"
    assert config_file.name in the_one("ConfigMap", "vramd-epp")["data"]
    assert epp["image"].startswith("registry.k8s.io/gateway-api-inference-extension/epp:v")
    assert not [a for a in args if a.endswith("-metric") or "-metric=" in a]


def test_picker_config_scores_queue_kv_cache_and_lora_affinity_and_names_a_picker() -> None:
    config = picker_config()
    assert config["apiVersion"] == "inference.networking.x-k8s.io/v1alpha1"
    assert config["kind"] == "EndpointPickerConfig"
    plugins = {plugin.get("name", plugin["type"]): plugin["type"] for plugin in config["plugins"]}
    (profile,) = config["schedulingProfiles"]
    referenced = {plugin["pluginRef"]: plugin.get("weight") for plugin in profile["plugins"]}
    assert set(referenced) <= set(plugins)
    scorers = {plugins[ref]: w for ref, w in referenced.items() if plugins[ref] in SCORERS}
    assert set(scorers) == SCORERS
    assert all(weight and weight > 0 for weight in scorers.values())
    assert "max-score-picker" in {plugins[ref] for ref in referenced}


def test_picker_reads_vllm_metric_names_from_vramd_metrics_path() -> None:
    config = picker_config()
    by_type = {plugin["type"]: plugin for plugin in config["plugins"]}
    assert by_type["metrics-data-source"]["parameters"]["path"] == "/metrics"
    (engine,) = by_type["core-metrics-extractor"]["parameters"]["engineConfigs"]
    assert engine["name"] == "vllm"
    assert {key: engine[key] for key in VLLM_METRIC_NAMES} == VLLM_METRIC_NAMES
    (source,) = config["dataLayer"]["sources"]
    assert source["pluginRef"] == "metrics-data-source"
    assert source["extractors"] == [{"pluginRef": "core-metrics-extractor"}]


def test_route_sends_picker_parsed_paths_to_the_pool_and_other_v1_to_the_service() -> None:
    route = the_one("HTTPRoute", "vramd")
    assert route["spec"]["parentRefs"][0]["kind"] == "Gateway"
    pool_rule, service_rule = route["spec"]["rules"]
    assert pool_rule["backendRefs"] == [
        {"group": "inference.networking.k8s.io", "kind": "InferencePool", "name": "vramd"}
    ]
    assert {m["path"]["type"] for m in pool_rule["matches"]} == {"Exact"}
    assert {m["path"]["value"] for m in pool_rule["matches"]} == PICKER_PARSED_PATHS
    service = the_one("Service", "vramd")
    (backend,) = service_rule["backendRefs"]
    assert (backend["kind"], backend["name"]) == ("Service", "vramd")
    assert backend["port"] == service["spec"]["ports"][0]["port"]
    assert service_rule["matches"] == [{"path": {"type": "PathPrefix", "value": "/v1"}}]
