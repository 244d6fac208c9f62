"""Validates the GKE manifests of deploy/gke against pinned schemas, offline.

    python validate-k8s.py FILE.yaml...

Kubernetes kinds (Job, Service, Secret, ...) are checked against the strict JSON schemas of
Kubernetes KUBERNETES_VERSION shipped in PyPI kubernetes-validate (pinned in
scripts/setup-python.sh); a JobSet against schemas/jobset-v1alpha2.schema.json, whose
replicated-job templates refer to the same Kubernetes schemas. Then siphon's own rules: an
Indexed Job's pod count agrees with SIPHON_NUM_PROCESSES, its coordinator is pod 0 under the
headless Service its pods name as subdomain, every pod gets the job token from a Secret, and a
preempted host's exit code 75 restarts the pods without using up the restart budget.
Prints one line per document; exits 1 if any fails.
"""

import json
import pathlib
import sys
from importlib.metadata import version as package_version

import jsonschema
import yaml
from kubernetes_validate import utils
from referencing import Registry, Resource

KUBERNETES_VERSION = "1.33.0"
PREEMPTED = 75  # siphon's exit code for "preempted, run the same command again"
HERE = pathlib.Path(__file__).resolve().parent


def kubernetes_definitions():
    schema_dir = f"v{KUBERNETES_VERSION}-local-strict"
    return utils.schema_contents(f"kubernetes-json-schema/{schema_dir}/_definitions.json", KUBERNETES_VERSION)


def validate_jobset(doc, definitions):
    schema = json.loads((HERE / "schemas" / "jobset-v1alpha2.schema.json").read_text())
    registry = Registry().with_resources(
        [(definitions["$id"], Resource.from_contents(definitions)), (schema["$id"], Resource.from_contents(schema))]
    )
    jsonschema.Draft202012Validator(schema, registry=registry).validate(doc)


def env_of(container):
    return {e["name"]: e for e in container.get("env", [])}


def check_pod(pod_spec, where, errors):
    for container in pod_spec["containers"]:
        token = env_of(container).get("SIPHON_JOB_TOKEN")
        if not token or "secretKeyRef" not in token.get("valueFrom", {}):
            errors.append(f"{where}: container {container['name']} does not take SIPHON_JOB_TOKEN from a Secret")


def check_preemption(spec, pod, action, where, errors):
    """The Job's podFailurePolicy answers a siphon container's exit code 75 with `action`."""
    names = {c["name"] for c in pod["containers"]}
    for rule in spec.get("podFailurePolicy", {}).get("rules", []):
        codes = rule.get("onExitCodes", {})
        if (
            rule.get("action") == action
            and codes.get("operator") == "In"
            and PREEMPTED in codes.get("values", [])
            and codes.get("containerName", next(iter(names))) in names
        ):
            return
    errors.append(f"{where}: no podFailurePolicy rule {action} for exit code {PREEMPTED} (preempted) of its container")


def check_siphon_rules(docs):
    """siphon's own consistency rules over all the documents of one file."""
    errors = []
    services = {d["metadata"]["name"]: d for d in docs if d["kind"] == "Service"}
    for doc in docs:
        name = doc["metadata"]["name"]
        if doc["kind"] == "Job":
            spec = doc["spec"]
            pod = spec["template"]["spec"]
            check_pod(pod, f"Job {name}", errors)
            check_preemption(spec, pod, "Ignore", f"Job {name}", errors)
            if spec.get("completionMode") != "Indexed":
                errors.append(f"Job {name}: completionMode must be Indexed (JOB_COMPLETION_INDEX is the process id)")
            if spec.get("completions") != spec.get("parallelism"):
                errors.append(f"Job {name}: completions and parallelism differ: every process must run at once")
            subdomain = pod.get("subdomain")
            service = services.get(subdomain)
            if service is None or service["spec"].get("clusterIP") != "None":
                errors.append(f"Job {name}: its pods' subdomain {subdomain!r} is not a headless Service in the file")
            elif service["spec"].get("selector", {}).items() - spec["template"]["metadata"].get("labels", {}).items():
                errors.append(f"Job {name}: Service {subdomain} does not select its pods")
            for container in pod["containers"]:
                env = env_of(container)
                count = env.get("SIPHON_NUM_PROCESSES", {}).get("value")
                if count != str(spec.get("completions")):
                    errors.append(f"Job {name}: SIPHON_NUM_PROCESSES={count} but completions={spec.get('completions')}")
                coordinator = env.get("SIPHON_COORDINATOR", {}).get("value", "")
                if not coordinator.startswith(f"{name}-0.{subdomain}:"):
                    errors.append(f"Job {name}: SIPHON_COORDINATOR={coordinator!r} is not pod 0 ({name}-0.{subdomain}:PORT)")
        if doc["kind"] == "JobSet":
            if not any(
                rule.get("action") == "RestartJobSetAndIgnoreMaxRestarts"
                and "PodFailurePolicy" in rule.get("onJobFailureReasons", [])
                for rule in doc["spec"].get("failurePolicy", {}).get("rules", [])
            ):
                errors.append(f"JobSet {name}: a preemption (a Job failed by PodFailurePolicy) would use up maxRestarts")
            if not doc["spec"].get("network", {}).get("enableDNSHostnames"):
                errors.append(f"JobSet {name}: network.enableDNSHostnames must be true (TPU_WORKER_HOSTNAMES are pod DNS names)")
            for rjob in doc["spec"]["replicatedJobs"]:
                spec = rjob["template"]["spec"]
                pod = spec["template"]["spec"]
                check_pod(pod, f"JobSet {name}/{rjob['name']}", errors)
                check_preemption(spec, pod, "FailJob", f"JobSet {name}/{rjob['name']}", errors)
                if spec.get("completions") != spec.get("parallelism") or spec.get("completionMode") != "Indexed":
                    errors.append(f"JobSet {name}/{rjob['name']}: needs an Indexed Job with completions = parallelism")
                for container in pod["containers"]:
                    limits = container.get("resources", {}).get("limits", {})
                    if "google.com/tpu" in limits and "cloud.google.com/gke-tpu-topology" not in pod.get("nodeSelector", {}):
                        errors.append(f"JobSet {name}: TPU pods need the cloud.google.com/gke-tpu-topology node selector")
                    total = env_of(container).get("SIPHON_TOTAL_MACHINES", {}).get("value")
                    if total is not None and total != str(rjob.get("replicas", 1)):
                        errors.append(f"JobSet {name}: SIPHON_TOTAL_MACHINES={total} but replicas={rjob.get('replicas', 1)}")
    return errors


def main(paths):
    definitions = kubernetes_definitions()
    failed = 0
    for path in paths:
        docs = [d for d in yaml.safe_load_all(pathlib.Path(path).read_text()) if d]
        for doc in docs:
            what = f"{path}: {doc.get('kind')}/{doc.get('metadata', {}).get('name')}"
            try:
                if doc.get("kind") == "JobSet":
                    validate_jobset(doc, definitions)
                    print(f"ok   {what} (JobSet v1alpha2 schema + Kubernetes {KUBERNETES_VERSION} JobTemplateSpec)")
                else:
                    version = utils.validate(doc, KUBERNETES_VERSION, strict=True)
                    print(f"ok   {what} (Kubernetes {version} strict schema)")
            except (jsonschema.ValidationError, utils.ValidationError) as error:
                location = ".".join(str(p) for p in error.absolute_path)
                print(f"FAIL {what}: {location}: {error.message}")
                failed += 1
            except utils.SchemaNotFoundError as error:
                print(f"FAIL {what}: {error.message}")
                failed += 1
        for error in check_siphon_rules(docs):
            print(f"FAIL {path}: {error}")
            failed += 1
    print(f"kubernetes-validate {package_version('kubernetes-validate')}, Kubernetes {KUBERNETES_VERSION}: {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
