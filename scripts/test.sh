#!/usr/bin/env bash
# The whole test suite, from a fresh Debian 12 machine:
#   install what is missing, build with ASan + UBSan, start a private
#   RabbitMQ on loopback, run the unit and integration tests (ctest), build
#   the libFuzzer targets with clang and fuzz each for a fixed time, then
#   stop the broker (also when a test fails).
#
# Environment: REBOUND_BUILD_DIR (default build/test),
#              REBOUND_FUZZ_SECONDS (default 30 per target, 0 skips fuzzing).
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/setup.sh
build=${REBOUND_BUILD_DIR:-build/test}
fuzz_seconds=${REBOUND_FUZZ_SECONDS:-30}
jobs=$(nproc)

echo "== build (ASan + UBSan) in $build/asan"
cmake -S . -B "$build/asan" -DCMAKE_BUILD_TYPE=Debug -DREBOUND_SANITIZE=ON \
  -DREBOUND_BENCH=ON >/dev/null
cmake --build "$build/asan" -j "$jobs"

echo "== private RabbitMQ"
broker_dir=$build/broker
trap 'scripts/broker.sh stop "$broker_dir" || true' EXIT
# the node stops with this script, even a killed one (broker.sh)
eval "export $(REBOUND_BROKER_OWNER=$$ scripts/broker.sh start "$broker_dir" |
  tail -n 1)"
export REBOUND_TEST_BROKER_DIR=$(cd "$broker_dir" && pwd)
echo "REBOUND_TEST_BROKER=$REBOUND_TEST_BROKER"

export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}

echo "== unit and integration tests"
# Most integration tests wait on the broker (TTLs, confirms) far more than
# they compute: twice as many side by side as there are cores, the
# heaviest counted as two (tests/CMakeLists.txt, PROCESSORS).
status=0
ctest --test-dir "$build/asan" --output-on-failure -j $((2 * jobs)) ||
  status=1

echo "== build without sanitizers in $build/valgrind"
cmake -S . -B "$build/valgrind" -DCMAKE_BUILD_TYPE=Debug -DREBOUND_BENCH=OFF \
  >/dev/null
cmake --build "$build/valgrind" -j "$jobs"
echo "== unit tests without sanitizers (ASan's allocator fill hides some defects)"
ctest --test-dir "$build/valgrind" --output-on-failure -j "$jobs" -L unit ||
  status=1
echo "== valgrind: rebound (no sanitizers) under rabbitmq-c traffic and retries, TLS on both sides, and the dead-letter tools"
REBOUND_WRAPPER="valgrind --quiet --leak-check=full --error-exitcode=9" \
  ctest --test-dir "$build/valgrind" --output-on-failure \
  -R '^test_(proxy|retry)_rabbitmq_c$|^test_tls_pika$|^test_dlq_tools$' ||
  status=1

if [ "$fuzz_seconds" != 0 ]; then
  echo "== fuzzing (clang, libFuzzer, ${fuzz_seconds}s per target)"
  CC=clang cmake -S . -B "$build/fuzz" -DCMAKE_BUILD_TYPE=Debug \
    -DREBOUND_SANITIZE=ON -DREBOUND_FUZZ=ON -DREBOUND_BENCH=OFF \
    -DREBOUND_FUZZ_SECONDS="$fuzz_seconds" >/dev/null
  cmake --build "$build/fuzz" -j "$jobs" \
    --target fuzz_frame fuzz_method fuzz_table fuzz_props fuzz_config \
    fuzz_session fuzz_dlq
  ctest --test-dir "$build/fuzz" --output-on-failure -j "$jobs" -R '^fuzz_' ||
    status=1
fi
exit $status
