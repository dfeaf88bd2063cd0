#!/usr/bin/env bash
# The kernels under AddressSanitizer + UndefinedBehaviorSanitizer, with every computed index
# checked (SV_CHECK_INDEX), on the ops, decoder and reliability tests and a fuzz sample.
#
#   tools/sanitize.sh         # exit status 0 only if the tests pass and nothing was reported
#
# Steps
#   1. copy the sources (tracked and new files of specverify/, tests/, experiments/, setup.py,
#      pyproject.toml) into a scratch directory -- never building into the repository's
#      specverify/;
#   2. build there with SPECVERIFY_BUILD=asan (-O1 -g -fsanitize=address,undefined,
#      -DSV_BOUNDSCHECK, Cython's bounds checks on);
#   3. run the tests with libasan preloaded (Python itself is not instrumented, so the runtime must
#      be loaded first) and pytest's capture off: UBSan reports go to stderr whatever log_path says,
#      and pytest would swallow the stderr of a passing test; stdout and stderr go to one log.  ASan
#      writes its reports to log files too; an index-check abort kills the run;
#   4. fail on any test failure, any sanitizer log file, or any report line in the captured output.
#
# Environment
#   PYTHON                     Python with the project's requirements (default: python)
#   SPECVERIFY_SANITIZE_TESTS  test files to run (default: the numeric contract, the chain, block, tree, batch and
#                              warp ops, decoder, reliability and fuzz tests)
#   SPECVERIFY_FUZZ_PROFILE    hypothesis profile of the fuzz sample (default: sanitize)
#   SPECVERIFY_KEEP=1          keep the scratch directory (printed at the end)
set -euo pipefail
export LC_ALL=C.UTF-8 PYTHONDONTWRITEBYTECODE=1 MPLBACKEND=Agg
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
PY=${PYTHON:-python}
TESTS=${SPECVERIFY_SANITIZE_TESTS:-tests/verify/test_ops_validation.py tests/verify/test_ops_reference.py tests/kernels/test_numeric_contract.py tests/verify/test_block_ops.py tests/verify/test_tree_ops.py tests/verify/test_batch.py tests/verify/test_warp.py tests/verify/test_linear.py tests/decoding/test_decoder.py tests/kernels/test_reliability.py tests/kernels/test_fuzz.py}
START=$SECONDS
log() { printf '[sanitize %4ds] %s\n' "$((SECONDS - START))" "$*"; }

WORK=$(mktemp -d "${TMPDIR:-/tmp}/specverify-sanitize.XXXXXX")
cleanup() {
    if [[ "${SPECVERIFY_KEEP:-0}" == 1 ]]; then echo "scratch kept: $WORK"; else rm -rf "$WORK"; fi
}
trap cleanup EXIT

log "copying sources to $WORK/src"
mkdir -p "$WORK/src" "$WORK/logs"
cd "$REPO"
if git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
    git ls-files -z --cached --others --exclude-standard -- specverify tests experiments setup.py pyproject.toml \
        | grep -zv '\.so$' | xargs -0 cp --parents -t "$WORK/src"
else
    cp -r specverify tests experiments setup.py pyproject.toml "$WORK/src"
    find "$WORK/src" -name '*.so' -delete
fi

log "building with SPECVERIFY_BUILD=asan"
cd "$WORK/src"
SPECVERIFY_BUILD=asan "$PY" setup.py -q build_ext --inplace > "$WORK/build.log" 2>&1 \
    || { cat "$WORK/build.log"; echo "sanitize: build failed" >&2; exit 2; }
SO=$(ls specverify/kernels/_kernels*.so)
symbols=$(nm -D "$SO")
for symbol in __asan_report_load __ubsan_handle_type_mismatch; do  # the instrumentation is in
    grep -q "$symbol" <<< "$symbols" || { echo "sanitize: $SO lacks $symbol: not a sanitizer build" >&2; exit 2; }
done
LIBASAN=$(${CC:-gcc} -print-file-name=libasan.so)
[[ -f "$LIBASAN" ]] || { echo "sanitize: libasan.so not found ($LIBASAN)" >&2; exit 2; }
# libstdc++ preloaded too: ASan resolves the real __cxa_throw when it starts, and torch throws
# C++ exceptions (e.g. DLPack export of a meta tensor) that would otherwise hit a CHECK failure.
PRELOAD="$LIBASAN $(${CC:-gcc} -print-file-name=libstdc++.so)"

# detect_leaks=0: CPython and torch keep allocations until exit by design.  Reports go to log files.
export ASAN_OPTIONS="detect_leaks=0:log_path=$WORK/logs/asan:print_summary=1"
export UBSAN_OPTIONS="print_stacktrace=1:log_path=$WORK/logs/ubsan:report_error_type=1"
export SPECVERIFY_FUZZ_PROFILE=${SPECVERIFY_FUZZ_PROFILE:-sanitize}
# Child processes the tests start import the instrumented copy too, not an installed specverify.
export PYTHONPATH="$WORK/src${PYTHONPATH:+:$PYTHONPATH}"
LD_PRELOAD="$PRELOAD" "$PY" -c "import specverify.kernels._kernels as k, sys; sys.exit(0 if k.bounds_checked() else 'not a checked build')"

log "running: $TESTS"
status=0
# --capture=no: a sanitizer report inside a passing test must reach the log (see step 3).
LD_PRELOAD="$PRELOAD" "$PY" -m pytest -q -p no:cacheprovider --capture=no $TESTS > "$WORK/pytest.log" 2>&1 || status=$?
tail -n 5 "$WORK/pytest.log"

reports=$(find "$WORK/logs" -type f | sort)
if [[ -n "$reports" ]]; then
    echo "sanitize: sanitizer reports:" >&2
    for f in $reports; do echo "== $f" >&2; head -n 60 "$f" >&2; done
    status=${status/#0/1}
fi
if grep -nE 'runtime error:|ERROR: AddressSanitizer|specverify: index ' "$WORK/pytest.log" >&2; then
    status=${status/#0/1}
fi
if [[ $status -ne 0 ]]; then
    echo "sanitize: FAILED (exit $status); full test log:" >&2
    tail -n 200 "$WORK/pytest.log" >&2
    exit "$status"
fi
log "clean: no ASan/UBSan report, no index-check abort"
