#!/usr/bin/env bash
# The one-command demo: a real kube-apiserver, rayshift (webhook registered, controller running), a sample
# incremental RayService, then an upgrade with live progress until promotion; everything is torn down at the
# end. KubeRay's and Gateway API's CRDs are the released ones, and the real KubeRay operator (built from its Go
# module) runs the RayClusters, with kube-scheduler and kwok running their Pods on a fake node; Ray Serve's
# dashboard and the Gateway controller are played by the test stand-ins.
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/rayshift/target/$(rustc -V | tr -c 'A-Za-z0-9.\n-' '_')}"
work=$(mktemp -d /tmp/rayshift-demo.XXXXXX)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  bash tests/env/kuberay.sh stop "$work/kuberay" >/dev/null 2>&1 || true
  bash tests/env/control-plane.sh stop "$work/cp" >/dev/null 2>&1 || true
  rm -rf "$work"
}
trap cleanup EXIT
fail() { echo "demo failed: $*" >&2; tail -n 15 "$work/rayshift.log" "$work/standins.log" "$work/kuberay/kuberay.log" >&2 2>/dev/null; exit 1; }
say() { printf '\n\033[1m== %s\033[0m\n' "$*"; }

# kwok's made-up Pod addresses must fail locally, never leave the machine.
bash tests/env/local-routes.sh ensure

say "building rayshift"
cargo build -q --bin rayshift --example demo_standins
bin="$CARGO_TARGET_DIR/debug"

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

say "starting rayshift run (webhook + controller) and registering the webhook"
"$bin/rayshift" certs generate --service rayshift --namespace rayshift-system --ip 127.0.0.1 --out "$work/certs" 2>/dev/null
"$bin/examples/demo_standins" "$KUBECONFIG" demo >"$work/standins.out" 2>"$work/standins.log" &
pids+=($!)
for _ in $(seq 100); do [ -s "$work/standins.out" ] && break; sleep 0.1; done
template=$(head -n1 "$work/standins.out")
"$bin/rayshift" run --mode=reconcile --kubeconfig "$KUBECONFIG" --namespace demo --feature-gates=RayServiceIncrementalUpgrade=true \
  --webhook-addr 127.0.0.1:19443 --metrics-addr 127.0.0.1:18080 \
  --tls-cert-file "$work/certs/tls.crt" --tls-key-file "$work/certs/tls.key" \
  --dashboard-url-template "$template" --serve-health-url-template "$template/-/healthz" --serve-poll-interval-seconds 0.5 --log-level info,kube=warn,kube_client=error \
  --log-format plain 2>"$work/rayshift.log" &
# (on failure: see $work/rayshift.log)
pids+=($!)
"$bin/rayshift" certs webhook-config --ca "$work/certs/ca.crt" --url https://127.0.0.1:19443 | k apply -f - >/dev/null
for _ in $(seq 200); do curl -sf 127.0.0.1:18080/readyz >/dev/null && break; sleep 0.1; done
curl -sf 127.0.0.1:18080/readyz >/dev/null || fail "rayshift is not ready"
sleep 1

say "a bad RayService is rejected at admission"
sed 's/stepSizePercent: 5/stepSizePercent: 150/' manifests/samples/rayservice-seed-example.yaml \
  | k apply -n demo -f - 2>&1 | sed 's/^/  /' || true

say "applying the sample incremental RayService (maxSurgePercent 20, stepSizePercent 5, intervalSeconds 1)"
sed 's/intervalSeconds: 10/intervalSeconds: 1/' manifests/samples/rayservice-seed-example.yaml \
  | sed 's|^  upgradeStrategy:|  managedBy: rayshift.io/controller\n  upgradeStrategy:|' \
  | k apply -n demo -f - 2>&1 | sed 's/^/  /'
k wait -n demo --for=condition=Ready rayservice/rayservice-incremental-upgrade --timeout=60s >/dev/null || { k get rayservice -n demo -o yaml | tail -40; fail "the sample did not become Ready"; }
echo "  Ready: $(k get rayservice -n demo rayservice-incremental-upgrade -o jsonpath='{.status.activeServiceStatus.rayClusterName}') serves 100%"
echo "  its head Pod, created by KubeRay's RayCluster controller and run by kwok:"
k get pods -n demo -l ray.io/node-type=head -o custom-columns=POD:.metadata.name,NODE:.spec.nodeName,IP:.status.podIP,PHASE:.status.phase \
  | sed 's/^/    /'

say "upgrading (new image); live progress from the RayService status"
k patch rayservice -n demo rayservice-incremental-upgrade --type=json \
  -p '[{"op":"replace","path":"/spec/rayClusterConfig/headGroupSpec/template/spec/containers/0/image","value":"rayproject/ray:2.47.0"}]' >/dev/null
start=$(date +%s.%N)
printf '%8s  %15s  %16s  %14s  %15s\n' time "active capacity" "pending capacity" "active traffic" "pending traffic"
last=""
old=$(k get rayservice -n demo rayservice-incremental-upgrade -o jsonpath='{.status.activeServiceStatus.rayClusterName}')
for _ in $(seq 3000); do
  line=$(k get rayservice -n demo rayservice-incremental-upgrade -o jsonpath='{.status.activeServiceStatus.rayClusterName} {.status.activeServiceStatus.targetCapacity} {.status.pendingServiceStatus.targetCapacity} {.status.activeServiceStatus.trafficRoutedPercent} {.status.pendingServiceStatus.trafficRoutedPercent} {.status.pendingServiceStatus.rayClusterName}')
  read -r active ac pc at pt pending <<<"$line"
  if [ "$active" != "$old" ] && [ -z "${pending:-}" ]; then
    printf '%7.1fs  promoted %s: it serves 100%%; %s is deleted after the delay\n' "$(echo "$(date +%s.%N) - $start" | bc)" "$active" "$old"
    break
  fi
  if [ -n "${pending:-}" ] && [ "$ac $pc $at $pt" != "$last" ]; then
    last="$ac $pc $at $pt"
    printf '%7.1fs  %14s%%  %15s%%  %13s%%  %14s%%\n' "$(echo "$(date +%s.%N) - $start" | bc)" "$ac" "${pc:-0}" "$at" "${pt:-0}"
  fi
  sleep 0.1
done
say "events"
k get events.events.k8s.io -n demo -o custom-columns=REASON:.reason,NOTE:.note --sort-by=.metadata.creationTimestamp | tail -n 8
say "metrics (excerpt)"
curl -s 127.0.0.1:18080/metrics | grep -E '^rayshift_(upgrades_total|traffic_steps_total|rayservice_target_capacity_percent)' | head -n 6
say "done; tearing down"
