#!/usr/bin/env bash
# Create (or reuse) the Python venv used to generate reference fixtures with
# llama.cpp (via llama-cpp-python). Idempotent: re-running only installs what
# is missing / changed in requirements.txt.
#
#   tools/reference/setup.sh            # prints the venv path on the last line
#   VENV=$(tools/reference/setup.sh | tail -n1)
#   $VENV/bin/python tools/reference/make_fixtures.py --model PATH.gguf
#
# Env:
#   SPECMESH_REF_VENV            venv location (default ~/.cache/specmesh/venv-ref)
#   CMAKE_BUILD_PARALLEL_LEVEL   parallel compile jobs for llama.cpp (default 2)
#   PYTHON                       interpreter used to create the venv (default python3)
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
venv="${SPECMESH_REF_VENV:-$HOME/.cache/specmesh/venv-ref}"
python="${PYTHON:-python3}"

if [[ ! -x "$venv/bin/python" ]]; then
  echo "creating venv at $venv" >&2
  mkdir -p "$(dirname "$venv")"
  "$python" -m venv "$venv"
  "$venv/bin/python" -m pip install --quiet --upgrade pip >&2
fi

# Skip pip entirely when requirements are already satisfied (fast re-runs).
stamp="$venv/.specmesh-requirements.sha256"
want="$(sha256sum "$here/requirements.txt" | cut -d' ' -f1)"
if [[ -f "$stamp" && "$(cat "$stamp")" == "$want" ]] \
   && "$venv/bin/python" -c 'import llama_cpp, jinja2, numpy, gguf' 2>/dev/null; then
  echo "requirements already installed" >&2
else
  # llama-cpp-python compiles llama.cpp from source (CPU build, no GPU backends).
  export CMAKE_BUILD_PARALLEL_LEVEL="${CMAKE_BUILD_PARALLEL_LEVEL:-2}"
  export CMAKE_ARGS="${CMAKE_ARGS:--DGGML_NATIVE=OFF -DGGML_CUDA=OFF -DGGML_METAL=OFF -DGGML_VULKAN=OFF -DLLAMA_CURL=OFF}"
  "$venv/bin/python" -m pip install --no-cache-dir -r "$here/requirements.txt" >&2
  echo "$want" > "$stamp"
fi

echo "$venv"
