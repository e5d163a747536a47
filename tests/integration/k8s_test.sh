#!/usr/bin/env bash
# The Kubernetes manifests of `orrery launch CONFIG --emit k8s`, checked by kubectl without a
# cluster. `kubectl create/apply --dry-run=client` need the API server's discovery even so;
# `--local` commands do not: `kubectl set env --local` decodes every document into kubectl's typed
# objects (wrong field types, bad quantities and unknown kinds fail; a non-pod object is decoded,
# then reported as "not a pod"), and `kubectl annotate --local -o json` gives what kubectl parsed,
# which is checked here: the run volume (a PersistentVolumeClaim mounted in every pod, holding
# the run's files), GPU requests and limits, and Indexed Jobs whose backoffLimit is
# fleet.restart_budget. Bad [fleet.k8s] settings and run files off the volume fail in one line.
# Without kubectl it prints one line and exits 77 (ctest: skipped).
# usage: k8s_test.sh ORRERY_BINARY
set -uo pipefail
orrery="$1"
command -v kubectl >/dev/null 2>&1 || { echo "SKIP: no kubectl (scripts/setup.sh installs kubernetes-client)"; exit 77; }
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }
# kubectl with no cluster configured: anything that tried to reach one would fail.
kube() { KUBECONFIG=/dev/null HOME="$tmp" kubectl "$@"; }
one_line_error() {  # one_line_error NAME EXPECTED_SUBSTRING -- ARGS...
  local name="$1" want="$2"; shift 3
  local out rc
  out="$("$orrery" "$@" 2>&1)"; rc=$?
  [ $rc -ne 0 ] || fail "$name: exited 0"
  [ "$(printf '%s\n' "$out" | wc -l)" -eq 1 ] || fail "$name: more than one line: $out"
  case "$out" in *"$want"*) ;; *) fail "$name: expected '$want' in: $out" ;; esac
}
# typed_check FILE: every document decodes into kubectl's typed objects.
typed_check() {
  kube set env --local --dry-run=client -o name -f "$1" ORRERY_CHECK=1 >"$tmp/typed.out" 2>"$tmp/typed.err"
  if grep -av "the object is not a pod or does not have a pod template" "$tmp/typed.err" | grep -aq .; then
    return 1
  fi
  return 0
}

write_config() {  # write_config FILE RUN_DIR [K8S_LINES]
  cat >"$1" <<EOF
[run]
name = "K8s_Fleet"
dir = "$2"
[replay]
path = "runs/k8s/replay/db"
checkpoint_dir = "runs/k8s/replay/checkpoints"
[[replay.tables]]
name = "trajectories"
[fleet]
transport = "tcp"
base_port = 6200
restart_budget = 4
[[fleet.roles]]
role = "replay"
memory_gb = 4.0
[[fleet.roles]]
role = "learner"
count = 2
cpus = 8
gpus = 2
memory_gb = 64.0
[[fleet.roles]]
role = "rollout"
count = 3
gpus = 1
restart = "never"
[fleet.k8s]
namespace = "ml"
image = "registry.example/orrery:1"
${3:-}
EOF
}

write_config "$tmp/fleet.toml" "runs/k8s" $'storage_class = "nfs-rwx"\nstorage_size = "2Ti"'
"$orrery" launch "$tmp/fleet.toml" --emit k8s >"$tmp/fleet.yaml" || fail "emit k8s"
typed_check "$tmp/fleet.yaml" || fail "kubectl cannot decode the manifests: $(cat "$tmp/typed.err")"
[ "$(grep -c . "$tmp/typed.out")" -eq 4 ] || fail "expected 4 Jobs from kubectl: $(cat "$tmp/typed.out")"
# The check can fail: a wrong field type, a malformed quantity.
sed 's/backoffLimit: 4/backoffLimit: "4"/' "$tmp/fleet.yaml" >"$tmp/bad_type.yaml"
! typed_check "$tmp/bad_type.yaml" || fail "kubectl accepted a string backoffLimit"
sed 's/storage: 2Ti/storage: 2 TB/' "$tmp/fleet.yaml" >"$tmp/bad_quantity.yaml"
! typed_check "$tmp/bad_quantity.yaml" || fail "kubectl accepted a malformed storage quantity"

kube annotate --local --dry-run=client -o json -f "$tmp/fleet.yaml" orrery/checked=true \
  >"$tmp/fleet.json" 2>"$tmp/annotate.err" || fail "kubectl annotate --local: $(cat "$tmp/annotate.err")"
python3 - "$tmp/fleet.json" <<'PY' || fail "manifest contents (above)"
import json, sys
def objects(path):  # kubectl prints one JSON object per document (some versions: a List)
    text, dec, pos, out = open(path).read(), json.JSONDecoder(), 0, []
    while text[pos:].strip():
        obj, pos = dec.raw_decode(text, len(text) - len(text[pos:].lstrip()))
        out += obj["items"] if obj.get("kind") == "List" else [obj]
    return out
items = objects(sys.argv[1])
by = {(i["kind"], i["metadata"]["name"]): i for i in items}
def check(ok, what):
    if not ok:
        sys.exit("manifest: " + what)
for i in items:
    check(i["metadata"].get("namespace") == "ml", "namespace of %s" % i["metadata"]["name"])
pvc = by.get(("PersistentVolumeClaim", "k8s-fleet-run"))
check(pvc is not None, "no PersistentVolumeClaim k8s-fleet-run: %s" % sorted(by))
check(pvc["spec"]["accessModes"] == ["ReadWriteMany"], "access modes")
check(pvc["spec"]["storageClassName"] == "nfs-rwx", "storage class")
check(pvc["spec"]["resources"]["requests"]["storage"] == "2Ti", "storage size")
check(("Service", "k8s-fleet-coordinator") in by, "no coordinator Service")
jobs = {n: i for (k, n), i in by.items() if k == "Job"}
want = {  # name: (completions, backoffLimit, restartPolicy, gpus)
    "k8s-fleet-coordinator": (1, 4, "OnFailure", 0),
    "k8s-fleet-replay": (1, 4, "OnFailure", 0),
    "k8s-fleet-learner": (2, 4, "OnFailure", 2),
    "k8s-fleet-rollout": (3, 0, "Never", 1),
}
check(sorted(jobs) == sorted(want), "Jobs %s" % sorted(jobs))
for name, (count, backoff, policy, gpus) in want.items():
    spec = jobs[name]["spec"]
    check(spec["completions"] == count and spec["parallelism"] == count, name + ": completions")
    check(spec["completionMode"] == "Indexed", name + ": completion mode")
    check(spec["backoffLimit"] == backoff, name + ": backoffLimit %s" % spec["backoffLimit"])
    pod = spec["template"]["spec"]
    check(pod["restartPolicy"] == policy, name + ": restart policy")
    vols = {v["name"]: v for v in pod["volumes"]}
    check(vols["run"]["persistentVolumeClaim"]["claimName"] == "k8s-fleet-run", name + ": volume")
    (c,) = pod["containers"]
    check({"name": "run", "mountPath": "/orrery"} in c["volumeMounts"], name + ": run mount")
    check(c["workingDir"] == "/orrery", name + ": working directory")
    check("--config-dir /orrery" in c["args"][0], name + ": --config-dir")
    res = c["resources"]
    if gpus:
        check(res["requests"]["nvidia.com/gpu"] == gpus, name + ": GPU request")
        check(res["limits"]["nvidia.com/gpu"] == gpus, name + ": GPU limit")
    else:
        check("nvidia.com/gpu" not in res.get("requests", {}) and "limits" not in res, name + ": GPUs")
    if name != "k8s-fleet-coordinator":
        check("--index $JOB_COMPLETION_INDEX" in c["args"][0], name + ": index")
        # No supervisor in a cluster: the actor's own watchdog ends it when its loop hangs.
        check("--progress-timeout-ms 120000" in c["args"][0], name + ": progress timeout")
        (w,) = pod["initContainers"]
        check("fleet status --connect tcp://k8s-fleet-coordinator.ml.svc:6200" in w["args"][0],
              name + ": waits for the coordinator")
learner = jobs["k8s-fleet-learner"]["spec"]["template"]["spec"]["containers"][0]
check(learner["resources"]["requests"]["cpu"] == "8" and learner["resources"]["requests"]["memory"] == "65536Mi",
      "learner cpu/memory requests")
PY
# Default volume: the cluster's default StorageClass (none named), 100Gi.
write_config "$tmp/default.toml" "runs/k8s"
"$orrery" launch "$tmp/default.toml" --emit k8s >"$tmp/default.yaml" || fail "emit k8s (defaults)"
kube annotate --local --dry-run=client -o json -f "$tmp/default.yaml" orrery/checked=true >"$tmp/default.json" ||
  fail "kubectl annotate --local (defaults)"
python3 - "$tmp/default.json" <<'PY' || fail "default volume (above)"
import json, sys
text, dec, pos, items = open(sys.argv[1]).read(), json.JSONDecoder(), 0, []
while text[pos:].strip():
    obj, pos = dec.raw_decode(text, len(text) - len(text[pos:].lstrip()))
    items += obj["items"] if obj.get("kind") == "List" else [obj]
(pvc,) = [i for i in items if i["kind"] == "PersistentVolumeClaim"]
if "storageClassName" in pvc["spec"] or pvc["spec"]["resources"]["requests"]["storage"] != "100Gi":
    sys.exit("default PVC: %s" % pvc["spec"])
PY

# --- bad input: one line, non-zero exit -------------------------------------------------------
write_config "$tmp/size.toml" "runs/k8s" 'storage_size = "2 TB"'
one_line_error storage-size "fleet.k8s.storage_size: expected a Kubernetes quantity" -- launch "$tmp/size.toml" --emit k8s
write_config "$tmp/outside.toml" "/scratch/runs/k8s"
one_line_error run-dir-off-volume "run.dir: resolves to /scratch/runs/k8s in the pods, off the run volume mounted at /orrery" \
  -- launch "$tmp/outside.toml" --emit k8s
sed 's|^path = "runs/k8s/replay/db"|path = "../db"|' "$tmp/default.toml" >"$tmp/replay_outside.toml"
one_line_error replay-off-volume "replay.path: resolves to /db in the pods" -- launch "$tmp/replay_outside.toml" --emit k8s
echo "k8s_test: all checks passed"
