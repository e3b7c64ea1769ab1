# test_deploy.py - deploy/kubernetes/: every manifest is valid against the agent-sandbox
# resources' own OpenAPI schemas (deploy/kubernetes/schemas/, from a release) and the set
# holds together; each deliberately broken copy is refused; the pod asks for the narrowest
# securityContext docs/KUBERNETES.md explains (and `conch doctor` names), nothing wider.
import copy
import importlib.util
import json
import re
import subprocess
import sys

import pytest
import yaml

from conftest import REPO

KUBE = REPO / "deploy" / "kubernetes"
_spec = importlib.util.spec_from_file_location("conch_validate", KUBE / "validate.py")
validate = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(validate)

CRDS = validate.load_crds()


def load(name):
    return yaml.safe_load((KUBE / name).read_text())


def all_docs():
    return [(p.name, yaml.safe_load(p.read_text())) for p in validate.manifests()]


def errors_of(docs):
    errs = []
    for where, d in docs:
        errs += validate.validate_doc(d, where, CRDS)
    return errs or validate.check_set(docs)


def test_the_schemas_are_a_release_of_agent_sandbox():
    readme = (KUBE / "schemas" / "README.md").read_text()
    assert re.search(r"v\d+\.\d+\.\d+", readme) and re.search(r"\b[0-9a-f]{40}\b", readme), readme
    assert "Apache License" in (KUBE / "schemas" / "LICENSE").read_text()
    kinds = {k for _, k in CRDS}
    assert kinds == {"Sandbox", "SandboxTemplate", "SandboxWarmPool", "SandboxClaim"}, kinds


def test_there_are_the_manifests():
    kinds = sorted(d["kind"] for _, d in all_docs())
    assert kinds == ["SandboxClaim", "SandboxTemplate", "SandboxWarmPool", "Service"], kinds


def test_every_manifest_is_valid():
    r = subprocess.run([sys.executable, str(KUBE / "validate.py")], capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    assert errors_of(all_docs()) == []


def _template_container(docs):
    t = next(d for _, d in docs if d["kind"] == "SandboxTemplate")
    return t, t["spec"]["podTemplate"]["spec"]["containers"][0]


# Each breaks one thing; validation must name it.
def _typo_field(docs):
    t, _ = _template_container(docs)
    t["spec"]["podTemplate"]["spec"]["hostUser"] = t["spec"]["podTemplate"]["spec"].pop("hostUsers")
    return "hostUser"


def _wrong_type(docs):
    p = next(d for _, d in docs if d["kind"] == "SandboxWarmPool")
    p["spec"]["replicas"] = "two"
    return "replicas"


def _missing_required(docs):
    t, _ = _template_container(docs)
    del t["spec"]["podTemplate"]
    return "podTemplate"


def _bad_enum(docs):
    t, _ = _template_container(docs)
    t["spec"]["networkPolicyManagement"] = "Sometimes"
    return "networkPolicyManagement"


def _container_typo(docs):
    _, c = _template_container(docs)
    c["securityContext"]["procmount"] = c["securityContext"].pop("procMount")
    return "procmount"


def _service_without_ports(docs):
    s = next(d for _, d in docs if d["kind"] == "Service")
    del s["spec"]["ports"]
    return "ports"


def _service_misses_the_pods(docs):
    s = next(d for _, d in docs if d["kind"] == "Service")
    s["spec"]["selector"] = {"app.kubernetes.io/name": "not-conch"}
    return "selector"


def _service_unknown_port(docs):
    s = next(d for _, d in docs if d["kind"] == "Service")
    s["spec"]["ports"][0]["targetPort"] = "grpc"
    return "targetPort"


def _pool_names_no_template(docs):
    p = next(d for _, d in docs if d["kind"] == "SandboxWarmPool")
    p["spec"]["sandboxTemplateRef"]["name"] = "nope"
    return "sandboxTemplateRef"


def _claim_names_no_pool(docs):
    c = next(d for _, d in docs if d["kind"] == "SandboxClaim")
    c["spec"]["warmPoolRef"]["name"] = "nope"
    return "warmPoolRef"


def _probe_on_another_port(docs):
    _, c = _template_container(docs)
    c["readinessProbe"]["httpGet"]["port"] = 9999
    return "readinessProbe"


def _tokens_on_no_volume(docs):
    _, c = _template_container(docs)
    c["args"][c["args"].index("--tokens") + 1] = "/etc/conch/tokens"
    return "--tokens"


def _bad_name(docs):
    docs[0][1]["metadata"]["name"] = "Conch_Template"
    return "metadata.name"


BREAKS = [_typo_field, _wrong_type, _missing_required, _bad_enum, _container_typo,
          _service_without_ports, _service_misses_the_pods, _service_unknown_port,
          _pool_names_no_template, _claim_names_no_pool, _probe_on_another_port,
          _tokens_on_no_volume, _bad_name]


@pytest.mark.parametrize("brk", BREAKS, ids=lambda f: f.__name__.strip("_"))
def test_a_broken_copy_is_refused(brk, tmp_path):
    docs = copy.deepcopy(all_docs())
    what = brk(docs)
    errs = errors_of(docs)
    assert errs and any(what in e for e in errs), (what, errs)
    # And from the command line, on files: exit 1 with the cause.
    for where, d in docs:
        (tmp_path / where).write_text(yaml.safe_dump(d))
    r = subprocess.run([sys.executable, str(KUBE / "validate.py")]
                       + sorted(str(p) for p in tmp_path.glob("*.yaml")),
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 1 and what in r.stderr, r.stdout + r.stderr


def test_the_pod_asks_for_the_narrowest_security_context():
    t, c = _template_container(all_docs())
    pod = t["spec"]["podTemplate"]["spec"]
    # An own user namespace first: whatever else is granted counts only inside it.
    assert pod["hostUsers"] is False
    psc = pod["securityContext"]
    assert psc["runAsNonRoot"] is True and psc["runAsUser"] == 10001
    assert psc["seccompProfile"] == {"type": "Localhost", "localhostProfile": "conch.json"}
    assert (REPO / "deploy" / "seccomp" / "conch.json").exists()
    assert pod.get("automountServiceAccountToken") is False
    for ctr in pod["containers"] + pod["initContainers"]:
        sc = ctr["securityContext"]
        assert sc["capabilities"] == {"drop": ["ALL"]}, ctr["name"]
        assert sc["allowPrivilegeEscalation"] is False and not sc.get("privileged"), ctr["name"]
        assert sc.get("readOnlyRootFilesystem") is True, ctr["name"]
    # Only the daemon's container mounts /proc of its own.
    assert c["securityContext"]["procMount"] == "Unmasked"
    assert "procMount" not in pod["initContainers"][0]["securityContext"]
    # The image's user is the pod's.
    assert "USER 10001:10001" in (REPO / "deploy" / "build-image").read_text()


def test_the_seccomp_profile_allows_what_conch_needs_and_no_more_than_the_default():
    prof = json.loads((REPO / "deploy" / "seccomp" / "conch.json").read_text())
    assert prof["defaultAction"] == "SCMP_ACT_ERRNO"
    uncond = set()
    for rule in prof["syscalls"]:
        if rule["action"] == "SCMP_ACT_ALLOW" and not rule.get("args") and not rule.get("includes"):
            uncond |= set(rule["names"])
    assert {"unshare", "mount", "umount2", "pivot_root", "setns", "sethostname", "clone",
            "clone3", "open_tree", "move_mount", "mount_setattr", "seccomp",
            "landlock_create_ruleset"} <= uncond
    # What container defaults keep from a container without CAP_SYS_ADMIN stays refused.
    for name in ("bpf", "kexec_load", "init_module", "open_by_handle_at", "swapon"):
        assert name not in uncond, name
