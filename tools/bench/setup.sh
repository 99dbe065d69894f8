#!/usr/bin/env bash
# Create (or reuse) the venv of the benchmark peer, llama.cpp via
# llama-cpp-python, for `specmesh bench --peer`. Idempotent: a re-run with the
# same requirements does nothing. Prints the venv's python on the last line.
#
#   PEER_PY=$(tools/bench/setup.sh | tail -n1)
#   specmesh bench --up --peer --peer-python "$PEER_PY"
#
# Unlike tools/reference/setup.sh (portable build, used for accuracy
# fixtures), llama.cpp is compiled here with the SIMD extensions our own
# kernels use (AVX2/FMA, AVX-512 with VNNI): a speed peer must get the same
# hardware as ours. Not -DGGML_NATIVE=ON: on this VM that build died of
# SIGILL (cause not found; it is not AMX as such, whose tiles the kernel
# grants to a process that asks, see crates/kernels/src/packed_amx.rs).
#
# Env:
#   SPECMESH_PEER_VENV           venv location (default ~/.cache/specmesh/venv-peer)
#   CMAKE_BUILD_PARALLEL_LEVEL   parallel compile jobs (default: all cores)
#   PYTHON                       interpreter that creates the venv (default python3)
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
venv="${SPECMESH_PEER_VENV:-$HOME/.cache/specmesh/venv-peer}"
python="${PYTHON:-python3}"

if [[ ! -x "$venv/bin/python" ]]; then
  echo "creating venv at $venv" >&2
  mkdir -p "$(dirname "$venv")"
  "$python" -m venv "$venv"
  "$venv/bin/python" -m pip install --quiet --upgrade pip >&2
fi

# SIMD flags from this CPU's own list, each on its own: a CPU with VNNI may
# lack VBMI (Cascade Lake), and a flag it lacks means SIGILL at the first token.
has() { grep -qw "$1" /proc/cpuinfo; }
simd="-DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON"
has avx512f && simd="$simd -DGGML_AVX512=ON"
has avx512vbmi && simd="$simd -DGGML_AVX512_VBMI=ON"
has avx512_vnni && simd="$simd -DGGML_AVX512_VNNI=ON"
has avx_vnni && simd="$simd -DGGML_AVX_VNNI=ON"
export CMAKE_ARGS="${CMAKE_ARGS:--DGGML_NATIVE=OFF $simd -DGGML_CUDA=OFF -DGGML_METAL=OFF -DGGML_VULKAN=OFF -DLLAMA_CURL=OFF}"

# The stamp covers the build flags too: other flags, another build.
stamp="$venv/.specmesh-requirements.sha256"
want="$( (cat "$here/requirements.txt"; echo "$CMAKE_ARGS") | sha256sum | cut -d' ' -f1)"
if [[ -f "$stamp" && "$(cat "$stamp")" == "$want" ]] \
   && "$venv/bin/python" -c 'import llama_cpp' 2>/dev/null; then
  echo "peer already installed" >&2
else
  echo "building llama.cpp for this CPU ($CMAKE_ARGS; several minutes)" >&2
  export CMAKE_BUILD_PARALLEL_LEVEL="${CMAKE_BUILD_PARALLEL_LEVEL:-$(nproc)}"
  "$venv/bin/python" -m pip install --no-cache-dir --force-reinstall --no-deps \
    -r "$here/requirements.txt" >&2
  "$venv/bin/python" -m pip install --no-cache-dir -r "$here/requirements.txt" >&2
  echo "$want" > "$stamp"
fi

echo "$venv/bin/python"
