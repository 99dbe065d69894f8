#!/usr/bin/env bash
# Builds (once) the benchmark peer: llama.cpp's own `llama-bench` and
# `llama-server`, compiled natively for this CPU from the llama.cpp source
# that llama-cpp-python vendors (a registry package, so nothing else is
# downloaded). Idempotent: a re-run with the same version and CPU does
# nothing. Prints the directory holding the binaries on the last line.
#
#   PEER_BIN=$(tools/bench/setup.sh | tail -n1)
#   specmesh bench --up --peer --peer-bin "$PEER_BIN"
#
# Why llama.cpp's binaries and not its Python binding: llama-cpp-python adds
# per-token work in Python (measured ~10–15% slower than llama-bench on
# SmolLM2-135M), and a speed peer must be the best this CPU can run.
# Why native (-DGGML_NATIVE=ON): the explicit-flag build measured 15–30%
# slower on SmolLM2-135M on this machine class.
#
# Env:
#   SPECMESH_PEER_DIR            where the build lives (default ~/.cache/specmesh/peer)
#   LLAMA_CPP_PYTHON_VERSION     which vendored llama.cpp (default 0.3.36)
#   CMAKE_BUILD_PARALLEL_LEVEL   parallel compile jobs (default: all cores)
#   GGML_NATIVE                  ON (default) or OFF for a portable build
#   PYTHON                       interpreter that makes the tool venv (default python3)
set -euo pipefail

version="${LLAMA_CPP_PYTHON_VERSION:-0.3.36}"
dir="${SPECMESH_PEER_DIR:-$HOME/.cache/specmesh/peer}"
python="${PYTHON:-python3}"
native="${GGML_NATIVE:-ON}"
jobs="${CMAKE_BUILD_PARALLEL_LEVEL:-$(nproc)}"
targets=(llama-bench llama-server)

# The stamp names what was built and for which CPU: another version, flag
# or processor model means another build.
cpu="$(grep -m1 '^model name' /proc/cpuinfo | cut -d: -f2- | xargs || true)"
flags="$(grep -m1 '^flags' /proc/cpuinfo | sha256sum | cut -c1-16)"
want="llama-cpp-python=$version native=$native cpu=$cpu flags=$flags"
stamp="$dir/bin/.specmesh-peer"
if [[ -f "$stamp" && "$(cat "$stamp")" == "$want" ]] \
   && [[ -x "$dir/bin/llama-server" && -x "$dir/bin/llama-bench" ]]; then
  echo "peer already built ($want)" >&2
  echo "$dir/bin"
  exit 0
fi

mkdir -p "$dir"
if [[ ! -x "$dir/venv/bin/cmake" || ! -x "$dir/venv/bin/ninja" ]]; then
  echo "installing cmake and ninja into $dir/venv" >&2
  "$python" -m venv "$dir/venv"
  "$dir/venv/bin/pip" install --quiet --disable-pip-version-check cmake ninja >&2
fi

src="$dir/src/llama_cpp_python-$version"
if [[ ! -d "$src/vendor/llama.cpp" ]]; then
  echo "fetching llama-cpp-python $version (its vendored llama.cpp source)" >&2
  mkdir -p "$dir/src"
  # --no-binary for this package only: its build tools still come as wheels.
  "$dir/venv/bin/pip" download --quiet --disable-pip-version-check --no-deps \
    --no-binary llama-cpp-python -d "$dir/src" "llama-cpp-python==$version" >&2
  tar xzf "$dir/src/llama_cpp_python-$version.tar.gz" -C "$dir/src"
fi

build="$dir/build"
rm -rf "$build"
echo "building ${targets[*]} with GGML_NATIVE=$native ($jobs jobs; several minutes)" >&2
PATH="$dir/venv/bin:$PATH" cmake -S "$src/vendor/llama.cpp" -B "$build" -G Ninja \
  -DGGML_NATIVE="$native" -DLLAMA_CURL=OFF -DCMAKE_BUILD_TYPE=Release \
  -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DGGML_CUDA=OFF -DGGML_METAL=OFF \
  -DGGML_VULKAN=OFF -DBUILD_SHARED_LIBS=OFF >&2
PATH="$dir/venv/bin:$PATH" cmake --build "$build" -j "$jobs" --target "${targets[@]}" >&2

mkdir -p "$dir/bin"
for t in "${targets[@]}"; do
  cp "$build/bin/$t" "$dir/bin/$t"
done
# What the bench JSON records as the peer's build: version, compiler, and
# the instruction sets the compiler enabled (-march=native resolves them).
{
  echo "llama-cpp-python $version (vendored llama.cpp)"
  "$dir/bin/llama-server" --version 2>&1 | grep -E '^(version|built with)' || true
  if [[ "$native" == ON ]]; then
    echo "GGML_NATIVE=ON: $(echo | cc -march=native -dM -E - 2>/dev/null \
      | grep -oE '__(AVX[A-Z0-9_]*|FMA|F16C|BMI2|AMX_[A-Z0-9]+)__' | tr -d _ | sort -u | tr '\n' ' ')"
  else
    echo "GGML_NATIVE=OFF"
  fi
} > "$dir/bin/BUILD_INFO"
echo "$want" > "$stamp"
echo "$dir/bin"
