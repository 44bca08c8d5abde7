#!/usr/bin/env python3
"""Helm's own code (the helm-sdkpy package, which ships Helm's library) and the Kubernetes
schemas (kubernetes-validate) for the deploy tests in Rust, which read one JSON request on stdin
and get one JSON answer on stdout.

Helm's library offers lint but no `template`; it renders by installing. So `render` installs the
chart against a small API server here, which answers discovery (the built-in kinds the chart uses
and the Prometheus Operator's), has no release yet, and takes every object Helm creates: Helm's
install runs as it would against a cluster, and its manifest is exactly what `helm template`
prints. No cluster is involved, and nothing leaves this process.

Requests (stdin, JSON):
  {"op": "render", "chart": DIR, "release": NAME, "namespace": NS, "values": {...},
   "operator": true}          -> {"manifest": TEXT, "created": [objects Helm sent to the API]}
  {"op": "lint", "chart": DIR, "values": {...}}
                              -> {"messages": [{"severity": N, "path": P}], "errors": N}
  {"op": "validate", "objects": [...]}
                              -> {"version": "1.37", "results": [{"kind", "name", "error"}]}
  {"op": "package", "chart": DIR}
                              -> {"files": {path in the archive: text}} (what `helm package` ships)

Regenerating docker/k8s/node-agent/gpumem.yaml (what the chart renders with default values):
  python3 tests/it/deploy/helm_tool.py template > docker/k8s/node-agent/gpumem.yaml
"""

import asyncio
import copy
import json
import os
import shutil
import sys
import tempfile
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
CHART = os.path.join(REPO, "deploy", "helm", "gpumem")

# What the API server says it serves: (group/version, resource, kind, namespaced).
BUILT_IN = [
    ("v1", "namespaces", "Namespace", False),
    ("v1", "configmaps", "ConfigMap", True),
    ("v1", "secrets", "Secret", True),
    ("v1", "services", "Service", True),
    ("v1", "serviceaccounts", "ServiceAccount", True),
    ("v1", "pods", "Pod", True),
    ("apps/v1", "daemonsets", "DaemonSet", True),
    ("apps/v1", "deployments", "Deployment", True),
    ("rbac.authorization.k8s.io/v1", "clusterroles", "ClusterRole", False),
    ("rbac.authorization.k8s.io/v1", "clusterrolebindings", "ClusterRoleBinding", False),
]
OPERATOR = [
    ("monitoring.coreos.com/v1", "servicemonitors", "ServiceMonitor", True),
    ("monitoring.coreos.com/v1", "podmonitors", "PodMonitor", True),
    ("monitoring.coreos.com/v1", "prometheusrules", "PrometheusRule", True),
]


class FakeApiServer:
    """Discovery, an empty release history, 404 for every lookup, and a record of every
    object created. Helm writes its release Secret as protobuf; it is echoed back as sent."""

    def __init__(self, resources):
        self.resources = resources
        self.created = []
        self.unanswered = []
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def _json(self, code, body):
                data = json.dumps(body).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _echo(self, code):
                length = int(self.headers.get("Content-Length", 0))
                body = self.rfile.read(length)
                kind = self.headers.get("Content-Type", "application/json")
                if kind.startswith("application/json"):
                    server.created.append(json.loads(body))
                self.send_response(code)
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self):
                path = self.path.split("?")[0]
                answer = server.discovery(path, self.path)
                if answer is not None:
                    return self._json(200, answer)
                return self._json(404, {"kind": "Status", "apiVersion": "v1",
                                        "status": "Failure", "reason": "NotFound", "code": 404})

            def do_POST(self):
                self._echo(201)

            def do_PUT(self):
                self._echo(200)

            def do_PATCH(self):
                server.unanswered.append(("PATCH", self.path))
                self._json(405, {"kind": "Status", "code": 405})

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def discovery(self, path, full):
        if path == "/version":
            return {"major": "1", "minor": "33", "gitVersion": "v1.33.0", "platform": "linux/amd64"}
        if path == "/api":
            return {"kind": "APIVersions", "versions": ["v1"], "serverAddressByClientCIDRs": []}
        if path == "/apis":
            groups = {}
            for gv, _, _, _ in self.resources:
                if "/" in gv:
                    group, version = gv.split("/")
                    groups.setdefault(group, []).append(version)
            return {"kind": "APIGroupList", "apiVersion": "v1", "groups": [
                {"name": g, "versions": [{"groupVersion": f"{g}/{v}", "version": v} for v in set(vs)],
                 "preferredVersion": {"groupVersion": f"{g}/{vs[0]}", "version": vs[0]}}
                for g, vs in groups.items()]}
        gv = path[len("/api/"):] if path.startswith("/api/") else path[len("/apis/"):]
        listed = [r for r in self.resources if r[0] == gv]
        if listed:
            return {"kind": "APIResourceList", "groupVersion": gv, "resources": [
                {"name": name, "singularName": kind.lower(), "namespaced": namespaced, "kind": kind,
                 "verbs": ["create", "delete", "get", "list", "patch", "update", "watch"]}
                for _, name, kind, namespaced in listed]}
        # Helm's release history: none yet.
        if path.endswith("/secrets") and "labelSelector=" in full:
            return {"kind": "SecretList", "apiVersion": "v1", "metadata": {}, "items": []}
        return None

    def kubeconfig(self):
        port = self.httpd.server_address[1]
        return (
            "apiVersion: v1\nkind: Config\n"
            f"clusters: [{{name: fake, cluster: {{server: 'http://127.0.0.1:{port}'}}}}]\n"
            "users: [{name: fake, user: {token: fake}}]\n"
            "contexts: [{name: fake, context: {cluster: fake, user: fake}}]\n"
            "current-context: fake\n"
        )

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


def helm():
    import helm_sdkpy

    return helm_sdkpy


def render(request):
    resources = BUILT_IN + (OPERATOR if request.get("operator", True) else [])
    server = FakeApiServer(resources)
    try:
        h = helm()
        config = h.Configuration(namespace=request["namespace"], kubeconfig=server.kubeconfig())
        release = asyncio.run(h.Install(config).run(
            request["release"], request["chart"], values=request.get("values") or None,
            wait=False, timeout=60, disable_openapi_validation=True))
        return {"manifest": release["manifest"], "notes": release.get("info", {}).get("notes", ""),
                "created": server.created, "unanswered": server.unanswered}
    except Exception as error:  # Helm's error, as Helm says it: the test shows it
        return {"error": f"{type(error).__name__}: {error}"}
    finally:
        server.close()


def merge(base, override):
    """Helm's rule for values: maps merge key by key, anything else is replaced."""
    merged = copy.deepcopy(base)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = merge(merged[key], value)
        else:
            merged[key] = value
    return merged


def lint(request):
    """Helm's lint takes no values; with some, it lints a copy whose values.yaml has them."""
    import yaml

    chart = request["chart"]
    values = request.get("values") or {}
    with tempfile.TemporaryDirectory(prefix="gpumem-lint-") as scratch:
        if values:
            copied = os.path.join(scratch, os.path.basename(chart))
            # Links are followed, as Helm's loader follows them.
            shutil.copytree(chart, copied, symlinks=False)
            with open(os.path.join(copied, "values.yaml")) as f:
                defaults = yaml.safe_load(f) or {}
            with open(os.path.join(copied, "values.yaml"), "w") as f:
                yaml.safe_dump(merge(defaults, values), f)
            chart = copied
        h = helm()
        config = h.Configuration(namespace="gpumem", kubeconfig="apiVersion: v1\nkind: Config\n")
        try:
            result = asyncio.run(h.Lint(config).run(chart))
        except Exception as error:
            return {"error": f"{type(error).__name__}: {error}"}
    messages = [{"severity": m.get("Severity", 0), "path": m.get("Path", "")}
                for m in result.get("Messages") or []]
    return {"messages": messages, "errors": len(result.get("Errors") or []),
            "charts": result.get("TotalChartsLinted", 0)}


def package(request):
    import tarfile

    with tempfile.TemporaryDirectory(prefix="gpumem-package-") as scratch:
        h = helm()
        config = h.Configuration(namespace="gpumem", kubeconfig="apiVersion: v1\nkind: Config\n")
        try:
            archive = asyncio.run(h.Package(config).run(request["chart"], scratch))
        except Exception as error:
            return {"error": f"{type(error).__name__}: {error}"}
        files = {}
        with tarfile.open(archive) as tar:
            for member in tar.getmembers():
                if member.isfile():
                    files[member.name] = tar.extractfile(member).read().decode("utf-8")
                else:
                    files[member.name] = None
    return {"files": files}


def validate(request):
    import kubernetes_validate

    version = kubernetes_validate.latest_version()
    results = []
    for obj in request["objects"]:
        name = f"{obj.get('kind')}/{obj.get('metadata', {}).get('name')}"
        try:
            kubernetes_validate.validate(obj, version, strict=True)
            error = None
        except kubernetes_validate.SchemaNotFoundError as e:
            error = f"no schema: {e}"
        except kubernetes_validate.ValidationError as e:
            error = f"{'.'.join(str(p) for p in e.path)}: {e.message}"
        results.append({"kind": obj.get("kind"), "name": name, "error": error})
    return {"version": version, "results": results}


def main():
    if sys.argv[1:] == ["template"]:
        answer = render({"chart": CHART, "release": "gpumem", "namespace": "gpumem", "values": {}})
        if "error" in answer:
            sys.exit(answer["error"])
        sys.stdout.write(HEADER + answer["manifest"])
        return
    request = json.load(sys.stdin)
    operations = {"render": render, "lint": lint, "validate": validate, "package": package}
    json.dump(operations[request["op"]](request), sys.stdout)


HEADER = """\
# Generated: the gpumem chart (deploy/helm/gpumem) rendered with its default values, release
# "gpumem" in namespace "gpumem", on a cluster with the Prometheus Operator. Do not edit; change
# the chart and regenerate:
#   python3 tests/it/deploy/helm_tool.py template > docker/k8s/node-agent/gpumem.yaml
# (or: helm template gpumem deploy/helm/gpumem -n gpumem --api-versions monitoring.coreos.com/v1)
# The deploy tests fail when this file and the chart disagree.
"""

if __name__ == "__main__":
    main()
