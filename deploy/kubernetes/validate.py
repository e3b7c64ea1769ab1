#!/usr/bin/python3
# validate.py - check conch's Kubernetes manifests against the agent-sandbox resources' own
# OpenAPI schemas (schemas/, copied from a release), strictly: a field the schema does not
# know is an error, as `kubectl apply --validate=strict` makes it. The Service gets a check
# of the fields Kubernetes requires, and the set is checked as a whole: references between
# the resources resolve, the Service selects the template's pods, the ports and files named
# in the pod exist. Debian's python3-jsonschema and python3-yaml.
#
# usage: deploy/kubernetes/validate.py [FILE.yaml ...]   (default: every manifest beside it)
import copy
import re
import sys
from pathlib import Path

import jsonschema
import yaml

HERE = Path(__file__).resolve().parent
SCHEMAS = HERE / "schemas"
# libyaml's loader when there (python3-yaml has it): the CRDs are 800 KB of YAML.
LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")


def _strict(schema):
    """A copy of @schema where an object with known properties refuses unknown ones (the
    API server prunes them, i.e. they would be silently lost: a typo is an error here)."""
    s = copy.deepcopy(schema)

    def walk(node):
        if isinstance(node, dict):
            if (node.get("type") == "object" and "properties" in node
                    and "additionalProperties" not in node
                    and not node.get("x-kubernetes-preserve-unknown-fields")):
                node["additionalProperties"] = False
            for v in node.values():
                walk(v)
        elif isinstance(node, list):
            for v in node:
                walk(v)

    walk(s)
    return s


def load_crds():
    """{(apiVersion, kind): strict openAPIV3Schema} for every served version of every CRD."""
    out = {}
    for f in sorted(SCHEMAS.glob("*.yaml")):
        crd = yaml.load(f.read_text(), Loader=LOADER)
        group = crd["spec"]["group"]
        kind = crd["spec"]["names"]["kind"]
        for v in crd["spec"]["versions"]:
            if v.get("served"):
                out[(f"{group}/{v['name']}", kind)] = _strict(v["schema"]["openAPIV3Schema"])
    return out


def _check_metadata(doc, where, errors):
    meta = doc.get("metadata")
    if not isinstance(meta, dict):
        errors.append(f"{where}: metadata is missing")
        return
    name = meta.get("name")
    if not isinstance(name, str) or len(name) > 253 or not DNS_SUBDOMAIN.match(name):
        errors.append(f"{where}: metadata.name {name!r} is not a DNS subdomain name")
    for key in ("labels", "annotations"):
        m = meta.get(key, {})
        if not isinstance(m, dict) or not all(isinstance(v, str) for v in m.values()):
            errors.append(f"{where}: metadata.{key} must map names to strings")
    unknown = set(meta) - {"name", "namespace", "labels", "annotations", "generateName"}
    if unknown:
        errors.append(f"{where}: metadata has unknown fields {sorted(unknown)}")


def _check_service(doc, where, errors):
    """What the API server requires of a Service, and what a headless one must not have."""
    spec = doc.get("spec")
    if not isinstance(spec, dict):
        errors.append(f"{where}: spec is missing")
        return
    known = {"clusterIP", "selector", "ports", "type", "publishNotReadyAddresses",
             "sessionAffinity", "ipFamilyPolicy"}
    if set(spec) - known:
        errors.append(f"{where}: spec has unknown fields {sorted(set(spec) - known)}")
    ports = spec.get("ports")
    if not isinstance(ports, list) or not ports:
        errors.append(f"{where}: spec.ports must be a non-empty list")
        ports = []
    for i, p in enumerate(ports):
        if not isinstance(p, dict):
            errors.append(f"{where}: spec.ports[{i}] must be an object")
            continue
        port = p.get("port")
        if not isinstance(port, int) or not 1 <= port <= 65535:
            errors.append(f"{where}: spec.ports[{i}].port {port!r} must be an integer 1..65535")
        if p.get("protocol", "TCP") not in ("TCP", "UDP", "SCTP"):
            errors.append(f"{where}: spec.ports[{i}].protocol {p.get('protocol')!r}")
        if len(ports) > 1 and not isinstance(p.get("name"), str):
            errors.append(f"{where}: spec.ports[{i}] needs a name when there are several")
        tp = p.get("targetPort", port)
        if not (isinstance(tp, int) and 1 <= tp <= 65535
                or isinstance(tp, str) and len(tp) <= 15 and DNS_LABEL.match(tp)):
            errors.append(f"{where}: spec.ports[{i}].targetPort {tp!r}")
    sel = spec.get("selector")
    if not isinstance(sel, dict) or not sel:
        errors.append(f"{where}: spec.selector must select the conch pods")


def validate_doc(doc, where, crds):
    """The errors of one manifest (a list of strings; empty when valid)."""
    errors = []
    if not isinstance(doc, dict):
        return [f"{where}: not a mapping"]
    api, kind = doc.get("apiVersion"), doc.get("kind")
    if not isinstance(api, str) or not isinstance(kind, str):
        return [f"{where}: apiVersion and kind are required"]
    _check_metadata(doc, where, errors)
    if (api, kind) == ("v1", "Service"):
        _check_service(doc, where, errors)
        return errors
    schema = crds.get((api, kind))
    if schema is None:
        return errors + [f"{where}: no schema for {kind} {api} in {SCHEMAS}"]
    body = {k: v for k, v in doc.items() if k != "metadata"}
    for e in sorted(jsonschema.Draft7Validator(schema).iter_errors(body), key=str):
        path = ".".join(str(p) for p in e.absolute_path) or "(top)"
        errors.append(f"{where}: {path}: {e.message}")
    if kind == "SandboxTemplate":
        for c in _containers(doc):
            if not isinstance(c, dict) or not c.get("name") or not c.get("image"):
                errors.append(f"{where}: every container needs a name and an image")
    return errors


def _containers(template, init=True):
    spec = (template.get("spec") or {}).get("podTemplate", {}).get("spec", {})
    return list(spec.get("containers") or []) + (list(spec.get("initContainers") or []) if init else [])


def _opt(args, name):
    return args[args.index(name) + 1] if name in args and args.index(name) + 1 < len(args) else None


def check_set(docs):
    """Cross-resource checks over (where, doc) pairs: names resolve, the Service reaches the
    pods, the pod's files and ports exist."""
    errors = []
    by_kind = {}
    for where, d in docs:
        if isinstance(d, dict):
            by_kind.setdefault(d.get("kind"), []).append((where, d))
    templates = {d["metadata"]["name"]: d for _, d in by_kind.get("SandboxTemplate", [])}
    pools = {d["metadata"]["name"] for _, d in by_kind.get("SandboxWarmPool", [])}
    for where, d in by_kind.get("SandboxWarmPool", []):
        ref = d["spec"]["sandboxTemplateRef"]["name"]
        if ref not in templates:
            errors.append(f"{where}: sandboxTemplateRef {ref!r} names no SandboxTemplate here")
    for where, d in by_kind.get("SandboxClaim", []):
        ref = (d["spec"].get("warmPoolRef") or {}).get("name")
        if ref not in pools:
            errors.append(f"{where}: warmPoolRef {ref!r} names no SandboxWarmPool here")
    for where, t in templates.items():
        pod = t["spec"]["podTemplate"]
        labels = (pod.get("metadata") or {}).get("labels") or {}
        ports = {p.get("name"): p.get("containerPort") for c in _containers(t, init=False)
                 for p in c.get("ports") or []}
        for swhere, s in by_kind.get("Service", []):
            sel = s["spec"].get("selector") or {}
            if any(labels.get(k) != v for k, v in sel.items()):
                errors.append(f"{swhere}: selector {sel} does not select template {where}'s pods {labels}")
            for p in s["spec"].get("ports") or []:
                tp = p.get("targetPort", p.get("port"))
                if tp not in ports and tp not in ports.values():
                    errors.append(f"{swhere}: targetPort {tp!r} is no port of template {where}")
        for c in _containers(t, init=False):
            args = [str(a) for a in c.get("args") or []]
            mounts = [m["mountPath"] for m in c.get("volumeMounts") or []]
            for opt in ("--tls-cert", "--tls-key", "--tokens", "--state-dir", "--socket"):
                path = _opt(args, opt)
                if path and not any(path.startswith(m.rstrip("/") + "/") for m in mounts):
                    errors.append(f"{where}: {c['name']}: {opt} {path} is on no mounted volume")
            listen = _opt(args, "--listen")
            for probe in ("readinessProbe", "livenessProbe"):
                get = (c.get(probe) or {}).get("httpGet")
                if not get:
                    errors.append(f"{where}: {c['name']}: no {probe} httpGet")
                    continue
                port = ports.get(get["port"], get["port"])
                if listen and not listen.endswith(f":{port}"):
                    errors.append(f"{where}: {c['name']}: {probe} port {port} is not --listen {listen}")
                if get.get("scheme") != "HTTPS" or get.get("path") != "/healthz":
                    errors.append(f"{where}: {c['name']}: {probe} must be GET https /healthz")
    return errors


def validate_files(paths):
    crds = load_crds()
    docs, errors = [], []
    for p in paths:
        for i, d in enumerate(yaml.load_all(Path(p).read_text(), Loader=LOADER)):
            if d is None:
                continue
            where = f"{Path(p).name}#{i}"
            errors += validate_doc(d, where, crds)
            docs.append((where, d))
    if not errors:
        errors += check_set(docs)
    return errors


def manifests():
    return sorted(HERE.glob("*.yaml"))


if __name__ == "__main__":
    files = sys.argv[1:] or manifests()
    errs = validate_files(files)
    for e in errs:
        print(e, file=sys.stderr)
    print(f"{len(files)} manifests: {'ok' if not errs else f'{len(errs)} errors'}")
    sys.exit(1 if errs else 0)
