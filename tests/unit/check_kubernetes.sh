#!/bin/sh
# contrib/kubernetes read as Kubernetes would (no cluster here, so by
# their structure): the native sidecar is an init container with
# restartPolicy Always, both variants probe /livez and /readyz, share the
# socket's emptyDir with the app, run as non-root on a read-only root, and
# carry a configuration that `leased -t` accepts (the native one is
# contrib/kubernetes/leased.yml, the file the image holds); the classic
# one drains for less time than the pod's grace period. Output is TAP.
srcdir=${LD_SRCDIR:-.}
# The python3 on PATH may be one without the yaml module; Debian's has it
# with python3-yaml.
py=
for p in python3 /usr/bin/python3; do
    if "$p" -c 'import yaml' 2>/dev/null; then
        py=$p
        break
    fi
done
if [ -z "$py" ]; then
    echo "1..1"
    echo "not ok 1 - no python3 with the yaml module (Debian package python3-yaml)"
    exit 1
fi
exec "$py" - "$srcdir/contrib/kubernetes" "${LEASED_BIN:-src/leased}" <<'PY'
import os, subprocess, sys, tempfile
import yaml

kdir, leased = sys.argv[1], sys.argv[2]
results = []

def check(name, cond, detail=""):
    results.append((bool(cond), name, detail))

def leased_t(text):
    with tempfile.NamedTemporaryFile("w", suffix=".yml", delete=False) as f:
        f.write(text)
    try:
        p = subprocess.run([leased, "-t", "-c", f.name], capture_output=True,
                           text=True, timeout=30)
    finally:
        os.unlink(f.name)
    return p.returncode, p.stdout + p.stderr

def variant(path, native):
    docs = list(yaml.safe_load_all(open(os.path.join(kdir, path))))
    cm = next(d for d in docs if d["kind"] == "ConfigMap")
    dep = next(d for d in docs if d["kind"] == "Deployment")
    pod = dep["spec"]["template"]["spec"]
    group = pod.get("initContainers", []) if native else pod["containers"]
    ld = next(c for c in group if c["name"] == "leased")
    app = next(c for c in pod["containers"] if c["name"] == "app")
    if native:
        check(path + ": leased is an init container with restartPolicy Always",
              ld.get("restartPolicy") == "Always")
        check(path + ": the startup probe waits for /readyz",
              ld["startupProbe"]["httpGet"]["path"] == "/readyz")
    check(path + ": liveness on /livez, readiness on /readyz",
          ld["livenessProbe"]["httpGet"]["path"] == "/livez"
          and ld["readinessProbe"]["httpGet"]["path"] == "/readyz")
    sock = {v["name"] for v in pod["volumes"] if "emptyDir" in v}
    mounts = lambda c: {m["name"]: m["mountPath"] for m in c["volumeMounts"]}
    shared = [n for n in sock if mounts(ld).get(n) == "/run/leased"
              and mounts(app).get(n) == "/run/leased"]
    check(path + ": the socket's emptyDir is shared with the app", shared)
    sc = ld["securityContext"]
    check(path + ": non-root, read-only root, no privilege escalation",
          pod["securityContext"]["runAsNonRoot"] and sc["runAsUser"] != 0
          and sc["readOnlyRootFilesystem"]
          and sc["allowPrivilegeEscalation"] is False)
    conf = cm["data"]["leased.yml"]
    parsed = yaml.safe_load(conf)
    check(path + ": the socket is on the shared volume",
          parsed["listen"]["unix"].startswith("/run/leased/"))
    return conf, parsed, pod

conf, _, _ = variant("native-sidecar.yaml", True)
check("native-sidecar.yaml: its ConfigMap is contrib/kubernetes/leased.yml",
      conf == open(os.path.join(kdir, "leased.yml")).read())
rc, out = leased_t(conf)
check("native-sidecar.yaml: leased -t accepts its configuration", rc == 0, out)

conf, parsed, pod = variant("classic-sidecar.yaml", False)
drain = parsed.get("shutdown", {}).get("drain_ms", 0)
check("classic-sidecar.yaml: shutdown.drain_ms is set, below the grace period",
      0 < drain < pod["terminationGracePeriodSeconds"] * 1000)
rc, out = leased_t(conf)
check("classic-sidecar.yaml: leased -t accepts its configuration", rc == 0, out)

print("1..%d" % len(results))
for i, (ok, name, detail) in enumerate(results, 1):
    print("%s %d - %s" % ("ok" if ok else "not ok", i, name))
    for line in detail.splitlines() if not ok else []:
        print("# " + line)
sys.exit(0 if all(r[0] for r in results) else 1)
PY
