#!/usr/bin/env bash
# Prove the aarch64 (NEON) build of specverify on an x86-64 Debian/Ubuntu host.
#
#   tools/aarch64_check.sh            # everything; exit status 0 only if every check passed
#
# Steps
#   1. host tools: aarch64 cross gcc/binutils, qemu-user-static, mmdebstrap, zstd (apt, only if
#      missing);
#   2. an arm64 Debian root file system (python3, numpy, pytest, headers) made by mmdebstrap and
#      cached under $SPECVERIFY_CACHE (default /var/cache/specverify), keyed by its package list;
#   3. the kernels' C generated once on the host exactly as setup.py would (same Cython
#      directives and compile flags, tools/cross_build.py), then compiled for each CPU in
#      $SPECVERIFY_AARCH64_CPUS (default: cortex-a72 cortex-a76) into a scratch tree -- never into
#      the repository's specverify/;
#   4. NEON proof for every "# hot loop" of the .pyx/.pxd/.pxi sources (tools/neon_report.py): gcc's
#      -fopt-info-vec-optimized must report the loop vectorized with 16-byte vectors, and
#      objdump must show SIMD arithmetic (fadd v.2d, umax v.4s, smax v.4s, ...) from its lines;
#      the first (oldest) CPU's build must hold no ARMv8.1+ instructions (LSE atomics, dot product);
#   5. the reduced, torch-free suite (pytest -m emulated) under qemu-aarch64 for the CPUs of
#      $SPECVERIFY_AARCH64_SUITE_CPUS (default: the oldest, a Pi 4's Cortex-A72); the other CPUs'
#      builds are proven by step 6 (every op, bit for bit against x86-64), which costs a tenth of
#      the emulated suite (6.5 minutes of a core per CPU);
#   6. cross-architecture agreement (tools/cross_agreement.py): fixed inputs and uniforms made on
#      x86-64; every (n_accepted, next_token) of the aarch64 builds under qemu must equal the
#      x86-64 build's (same C, host gcc, -march=native); also for the oldest CPU's build on the
#      newest emulated CPU (a Pi 4 build must run on a Pi 5: the agreement cases call every op;
#      the suite there would test the same code a third time, for 3 more minutes of CPU);
#   7. the same C built for each x86-64 level this host can run ($SPECVERIFY_X86_LEVELS, default
#      x86-64 = SSE2, x86-64-v3 = AVX2 + FMA, x86-64-v4 = AVX-512): the reduced suite and the
#      agreement run natively.  Each level compiles its own vector loops (_primitives.pxd,
#      _linear.pxi) and -march=native exercises one of them: on an AVX-512 host the AVX2 and
#      SSE2 loops are proven here only.
#
# Environment
#   PYTHON                    host Python with Cython, NumPy, setuptools (default: python3, else python)
#   SPECVERIFY_CACHE          cache directory for the root file system (default /var/cache/specverify,
#                             or ~/.cache/specverify when that is not writable)
#   SPECVERIFY_AARCH64_CPUS   CPUs to build and emulate, oldest first (default "cortex-a72 cortex-a76")
#   SPECVERIFY_AARCH64_SUITE_CPUS  CPUs whose build also runs the emulated suite (default: the oldest;
#                             "all": every CPU)
#   SPECVERIFY_DEBIAN_MIRROR  Debian mirror for mmdebstrap (default: mmdebstrap's)
#   SPECVERIFY_AGREEMENT_CASES number of agreement cases (default 300)
#   SPECVERIFY_AARCH64_JOBS   emulated runs side by side (default: the usable CPUs)
#   SPECVERIFY_X86_LEVELS     x86-64 levels of step 7 (default "x86-64 x86-64-v3 x86-64-v4"; those
#                             the host cannot run are skipped and said so)
#   SPECVERIFY_KEEP=1         keep the scratch directory (printed at the end)
set -euo pipefail
export DEBIAN_FRONTEND=noninteractive
export LC_ALL=C.UTF-8 PYTHONDONTWRITEBYTECODE=1

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
HOST_INC='' HOST_NP='' HOST_EXT=''  # the host Python's headers, NumPy's, extension suffix
PY=''   # host Python with Cython, numpy, setuptools: $PYTHON, else python3, else python
read -r -a CPUS <<< "${SPECVERIFY_AARCH64_CPUS:-cortex-a72 cortex-a76}"
SUITE_CPUS=${SPECVERIFY_AARCH64_SUITE_CPUS:-${CPUS[0]}}
[[ $SUITE_CPUS == all ]] && SUITE_CPUS="${CPUS[*]}"
SUITE=bookworm
# python3-scipy: specverify.stats (the emulated statistical tests) needs it.
ROOTFS_PKGS=(python3 python3-dev python3-numpy python3-scipy python3-pytest gcc libc6-dev)
HOST_PKGS=(gcc-aarch64-linux-gnu binutils-aarch64-linux-gnu qemu-user-static mmdebstrap zstd)
CROSS=aarch64-linux-gnu
AGREEMENT_CASES=${SPECVERIFY_AGREEMENT_CASES:-300}
JOBS=${SPECVERIFY_AARCH64_JOBS:-$(nproc)}
read -r -a X86_LEVELS <<< "${SPECVERIFY_X86_LEVELS-x86-64 x86-64-v3 x86-64-v4}"
# ARMv8.1+ instructions a Cortex-A72 (ARMv8.0) would trap on: LSE atomics, RCpc loads, dot product.
V81_INSNS='(cas|casa|casl|casal|casp\w*|casb|cash|casab|casah|casalb|casalh|caslb|caslh|ldadd\w*|ldclr\w*|ldeor\w*|ldset\w*|ldsmax\w*|ldsmin\w*|ldumax\w*|ldumin\w*|stadd\w*|stclr\w*|steor\w*|stset\w*|swp\w*|ldapr\w*|sdot|udot|sqrdmlah|sqrdmlsh)'

START=$SECONDS
log()  { printf '[aarch64 %4ds] %s\n' "$((SECONDS - START))" "$*"; }
die()  { printf 'aarch64_check: ERROR: %s\n' "$*" >&2; exit 2; }
# Failures go to a file, not an array: the emulated runs below are subshells running side by side.
FAILURES_FILE=''
fail() { printf 'aarch64_check: FAIL: %s\n' "$*" >&2; printf '%s\n' "$*" >>"$FAILURES_FILE"; }

WORK=$(mktemp -d "${TMPDIR:-/tmp}/specverify-aarch64.XXXXXX")
FAILURES_FILE=$WORK/failures.txt
: >"$FAILURES_FILE"
cleanup() {
    if [[ "${SPECVERIFY_KEEP:-0}" == 1 ]]; then
        echo "scratch kept: $WORK"
    else
        rm -rf "$WORK"
    fi
}
trap cleanup EXIT

as_root() {
    if [[ $(id -u) -eq 0 ]]; then "$@"
    elif command -v sudo >/dev/null && sudo -n true 2>/dev/null; then sudo -n "$@"
    else die "need root (or passwordless sudo) for: $*"
    fi
}

# ---------------------------------------------------------------------------------------------
# 1. host tools
# ---------------------------------------------------------------------------------------------
ensure_host_tools() {
    local missing=() p
    for p in "${HOST_PKGS[@]}"; do
        [[ $(dpkg-query -W -f='${db:Status-Status}' "$p" 2>/dev/null || true) == installed ]] || missing+=("$p")
    done
    if ((${#missing[@]})); then
        log "installing ${missing[*]}"
        as_root apt-get update -qq
        as_root apt-get install -y -qq --no-install-recommends -o Dpkg::Use-Pty=0 "${missing[@]}" >/dev/null
    fi
    for p in "$CROSS-gcc" "$CROSS-objdump" qemu-aarch64-static mmdebstrap zstd gcc flock; do
        command -v "$p" >/dev/null || die "'$p' not found after installing ${HOST_PKGS[*]}"
    done
    local py
    for py in ${PYTHON:-python3 python}; do
        if "$py" -c 'import Cython, numpy, setuptools' 2>/dev/null; then PY=$py; return 0; fi
    done
    die "no host Python with Cython, numpy and setuptools (tried ${PYTHON:-python3 python}; set PYTHON=...)"
}

# ---------------------------------------------------------------------------------------------
# 2. arm64 root file system (cached)
# ---------------------------------------------------------------------------------------------
ensure_rootfs() {
    local cache=${SPECVERIFY_CACHE:-/var/cache/specverify}
    if ! mkdir -p "$cache" 2>/dev/null || [[ ! -w $cache ]]; then
        cache=${XDG_CACHE_HOME:-$HOME/.cache}/specverify
        mkdir -p "$cache"
    fi
    local mirror=${SPECVERIFY_DEBIAN_MIRROR:-}
    local key
    key=$(printf 'v1 %s arm64 extract %s %s' "$SUITE" "${ROOTFS_PKGS[*]}" "$mirror" | sha256sum | cut -c1-16)
    ROOTFS=$cache/rootfs-$SUITE-arm64-$key
    local tarball=$ROOTFS.tar.zst
    exec 9>"$ROOTFS.lock"
    flock 9
    if [[ ! -f $ROOTFS/.complete ]]; then
        if [[ ! -s $tarball ]]; then
            log "building the arm64 $SUITE root file system with mmdebstrap (${ROOTFS_PKGS[*]}) -> $tarball"
            local mode=root
            [[ $(id -u) -eq 0 ]] || mode=unshare
            local partial=$cache/partial-$key.tar.zst
            rm -f "$partial"
            # --variant=extract: unpack the packages without running maintainer scripts (no
            # binfmt_misc needed, minutes faster); hence the BLAS path in LD_LIBRARY_PATH below.
            if ! mmdebstrap --quiet --variant=extract --mode="$mode" --arch=arm64 \
                    --include="$(IFS=,; echo "${ROOTFS_PKGS[*]}")" \
                    --aptopt='Acquire::Retries "3"' \
                    "$SUITE" "$partial" ${mirror:+"$mirror"} >"$WORK/mmdebstrap.log" 2>&1; then
                tail -n 30 "$WORK/mmdebstrap.log" >&2
                die "mmdebstrap failed (log above)"
            fi
            mv -f "$partial" "$tarball"
        fi
        log "unpacking $tarball"
        rm -rf "$ROOTFS.partial"
        mkdir -p "$ROOTFS.partial"
        # /dev comes from the host (qemu -L falls back to host paths that the prefix lacks)
        tar --zstd -xf "$tarball" -C "$ROOTFS.partial" --exclude='./dev/*'
        rm -rf "$ROOTFS"
        mv "$ROOTFS.partial" "$ROOTFS"
        touch "$ROOTFS/.complete"
    fi
    flock -u 9
    TARGET_PYINC=$(ls -d "$ROOTFS"/usr/include/python3.[0-9]* 2>/dev/null | grep -E 'python3\.[0-9]+$' | sort -V | tail -n1 || true)
    [[ -n $TARGET_PYINC && -f $TARGET_PYINC/Python.h ]] || die "no Python.h in $ROOTFS (delete it to rebuild)"
    TARGET_PYVER=${TARGET_PYINC##*/python}
    TARGET_EXT=.cpython-${TARGET_PYVER/./}-aarch64-linux-gnu.so
    TARGET_NPINC=$(ls -d "$ROOTFS"/usr/lib/python3/dist-packages/numpy/{core,_core}/include 2>/dev/null | head -n1 || true)
    TARGET_PY=$ROOTFS/usr/bin/python$TARGET_PYVER
    [[ -x $TARGET_PY ]] || die "$TARGET_PY missing (delete $ROOTFS to rebuild)"
}

# A launcher per emulated CPU: a shell script that runs the rootfs's python under qemu with argv[0]
# set to the launcher itself, so that the emulated sys.executable is the launcher and tests that
# start "sys.executable" in a subprocess get an emulated child on the same CPU (no binfmt_misc).
make_launcher() {
    local cpu=$1 launcher=$WORK/bin/python3-$1
    mkdir -p "$WORK/bin"
    cat >"$launcher" <<EOF
#!/bin/sh
exec $(command -v qemu-aarch64-static) -L '$ROOTFS' -cpu '$cpu' -0 "\$0" '$TARGET_PY' "\$@"
EOF
    chmod +x "$launcher"
}

# run the rootfs's python3 under qemu: qemu_py <cpu> <tree> args...  (cwd = tree)
qemu_py() {
    local cpu=$1 tree=$2
    shift 2
    [[ -x $WORK/bin/python3-$cpu ]] || make_launcher "$cpu"
    (cd "$tree" && env -i PATH=/usr/bin:/bin HOME="$WORK/home" LANG=C.UTF-8 TMPDIR="$WORK/tmp" \
        PYTHONPATH="$tree" PYTHONDONTWRITEBYTECODE=1 PYTHONHASHSEED=0 SPECVERIFY_EMULATED=1 \
        LD_LIBRARY_PATH=/usr/lib/aarch64-linux-gnu/blas:/usr/lib/aarch64-linux-gnu/lapack \
        "$WORK/bin/python3-$cpu" "$@")
}

# copy the package's Python files, the tests (and tools/ and experiments/, which some tests
# import: under qemu those skip for want of torch, natively they run) and the pytest
# configuration into a scratch tree
make_tree() {
    local tree=$1 f
    mkdir -p "$tree"
    (cd "$REPO" && find specverify tests tools experiments -type f \( -name '*.py' -o -name '*.pyx' -o -name '*.pxd' \
        -o -name '*.json' -o -name '*.npz' -o -name '*.txt' \) -not -path '*/__pycache__/*' -print0 \
        | xargs -0 cp --parents -t "$tree")
    for f in pytest.ini pyproject.toml setup.cfg tox.ini conftest.py; do
        [[ -f $REPO/$f ]] && cp "$REPO/$f" "$tree/"
    done
    return 0
}

# run the host's python on a tree's build: host_py <tree> args...  (cwd = tree; the reduced case
# counts, as under qemu)
host_py() {
    local tree=$1
    shift
    (cd "$tree" && PYTHONPATH="$tree" PYTHONHASHSEED=0 SPECVERIFY_EMULATED=1 TMPDIR="$WORK/tmp" "$PY" "$@")
}

# The reduced suite (if <suite> is 1) and the agreement run of the build in <tree>, its python
# run by the command after the arguments (qemu_py <cpu> <tree> or host_py <tree>).  Writes
# report/suite-<report>.txt and report/agree-<report>.txt (one line each) and records failures
# with ``fail``; runs in a subshell beside the others.
suite_and_agreement() {
    local tag=$1 report=$2 suite=$3 tree=$4 ext=$5
    shift 5
    local log_file=$WORK/report/pytest-$report.log suite_file=$WORK/report/suite-$report.txt
    local agree_file=$WORK/report/agree-$report.txt run_log=$WORK/report/agree-run-$report.log
    local rc=0 summary
    : >"$suite_file"
    : >"$agree_file"
    if ((suite)); then
        log "$tag: pytest -m emulated"
        "$@" -m pytest -m emulated -q -p no:cacheprovider tests/ >"$log_file" 2>&1 || rc=$?
        summary=$(grep -E '^(=+ )?[0-9]+ (passed|failed|error|skipped|deselected)|no tests ran' "$log_file" | tail -n1 | sed -E 's/=+//g; s/^ +| +$//g')
        echo "$tag: ${summary:-no pytest summary (rc=$rc)}" >"$suite_file"
        if ((rc == 5)); then
            fail "$tag: no test is marked @pytest.mark.emulated"
        elif ((rc != 0)); then
            tail -n 40 "$log_file" >&2
            fail "$tag: suite failed (rc=$rc): $summary"
        fi
        log "$tag: ${summary:-rc=$rc}"
    else
        echo "$tag: agreement run only (the emulated suite runs on: $SUITE_CPUS)" >"$suite_file"
    fi
    log "$tag: agreement run"
    # the run names the module it loaded: it must be this tree's build
    if "$@" "$WORK/cross_agreement.py" run --cases "$WORK/cases.npz" --out "$WORK/answers-$report.npz" \
            >"$run_log" 2>&1 && grep -qF "($tree/specverify/kernels/_kernels$ext)" "$run_log"; then
        "$PY" "$REPO/tools/cross_agreement.py" compare --expected "$WORK/x86.npz" \
            --got "$WORK/answers-$report.npz" --cases "$WORK/cases.npz" --label "$tag" \
            --dump "$WORK/report/mismatch-$report.npz" >"$agree_file" \
            || fail "$tag: results differ from the x86-64 -march=native build (inputs: report/mismatch-$report.npz)"
        cat "$agree_file"
    else
        tail -n 30 "$run_log" >&2
        fail "$tag: agreement run crashed (or did not load this build)"
        echo "[$tag] agreement: run crashed" >"$agree_file"
    fi
}

# Steps 5 and 6b: <build>'s tree under qemu emulating <emu>, the suite if <suite> is 1.
emulated_run() {
    local build=$1 emu=$2 suite=$3
    suite_and_agreement "$build build on emulated $emu" "$build-on-$emu" "$suite" "$WORK/$build/tree" \
        "$TARGET_EXT" qemu_py "$emu" "$WORK/$build/tree"
}

# 0 if this host's CPU runs code built with -march=<level> (gcc's own ISA-level test)
host_runs_level() {
    local probe=$WORK/tmp/level-${1//[^A-Za-z0-9]/_}
    printf 'int main(void) { __builtin_cpu_init(); return !__builtin_cpu_supports("%s"); }\n' "$1" >"$probe.c"
    gcc "$probe.c" -o "$probe" 2>/dev/null && "$probe"
}

# Build every extension of exts.tsv (setup.py's flags) into <tree> with the host's gcc and
# -march=<march>: build_host_tree <tree> <march> <log>.  On a failure: the compiler's output on
# stderr, the extension's name on stdout, status 1.
build_host_tree() {
    local tree=$1 march=$2 build_log=$3 name c pyx args so
    while IFS=$'\t' read -r name c pyx args; do
        so=$tree/${name//.//}$HOST_EXT
        # shellcheck disable=SC2086
        gcc -shared -fPIC -DNDEBUG -fwrapv $args -march="$march" -I"$HOST_INC" -I"$HOST_NP" "$c" -o "$so" \
            </dev/null 2>"$build_log" || { cat "$build_log" >&2; echo "$name"; return 1; }
    done <"$WORK/exts.tsv"
}

# Step 7 for one x86-64 <level>: the same C built with -march=<level> into its own tree, then the
# reduced suite and the agreement run on this host.
x86_level_run() {
    local level=$1 tag="x86-64 build for $1" report=x86-$1 tree=$WORK/x86-$1/tree
    local failed
    if ! host_runs_level "$level"; then
        echo "$tag: skipped, this CPU cannot run it" >"$WORK/report/suite-$report.txt"
        echo "[$tag] skipped, this CPU cannot run it" >"$WORK/report/agree-$report.txt"
        return 0
    fi
    make_tree "$tree"
    if ! failed=$(build_host_tree "$tree" "$level" "$WORK/report/build-$report.log"); then
        fail "$tag: build of $failed failed"
        echo "$tag: build failed" >"$WORK/report/suite-$report.txt"
        echo "[$tag] build failed" >"$WORK/report/agree-$report.txt"
        return 0
    fi
    suite_and_agreement "$tag" "$report" 1 "$tree" "$HOST_EXT" host_py "$tree"
}

# ---------------------------------------------------------------------------------------------
main() {
    log "repo $REPO, CPUs ${CPUS[*]}, scratch $WORK"
    mkdir -p "$WORK/home" "$WORK/tmp" "$WORK/report"
    ensure_host_tools
    ensure_rootfs
    log "rootfs $ROOTFS (python $TARGET_PYVER)"

    # 3. C generated once, as setup.py would
    "$PY" "$REPO/tools/cross_build.py" --repo "$REPO" --out "$WORK/gen" >"$WORK/exts.tsv" \
        || die "cythonizing failed (tools/cross_build.py)"
    [[ -s $WORK/exts.tsv ]] || die "setup.py declares no extension"
    local name c pyx args so cpu
    HOST_INC=$("$PY" -c 'import sysconfig; print(sysconfig.get_paths()["include"])')
    HOST_NP=$("$PY" -c 'import numpy; print(numpy.get_include())')
    HOST_EXT=$("$PY" -c 'import sysconfig; print(sysconfig.get_config_var("EXT_SUFFIX"))')

    # x86-64 reference build of the same C (setup.py's flags; -march=native as setup.py's default)
    make_tree "$WORK/x86/tree"
    local failed
    failed=$(build_host_tree "$WORK/x86/tree" native "$WORK/x86/build.log") || die "x86-64 build of $failed failed"
    log "x86-64 reference build done"

    # 4. aarch64 builds + NEON proof
    for cpu in "${CPUS[@]}"; do
        local d=$WORK/$cpu
        make_tree "$d/tree"
        : >"$d/neon.txt"
        while IFS=$'\t' read -r name c pyx args; do
            so=$d/tree/${name//.//}$TARGET_EXT
            # -g adds line tables for the objdump mapping; it never changes the generated code.
            # shellcheck disable=SC2086
            "$CROSS-gcc" --sysroot="$ROOTFS" -shared -fPIC -DNDEBUG -g -fwrapv $args -mcpu="$cpu" \
                -I"$TARGET_PYINC" -I"$ROOTFS/usr/include/aarch64-linux-gnu/python$TARGET_PYVER" \
                ${TARGET_NPINC:+-I"$TARGET_NPINC"} \
                -fopt-info-vec-optimized="$d/$name.optinfo" "$c" -o "$so" 2>"$d/build.log" </dev/null \
                || { cat "$d/build.log" >&2; die "$cpu build of $name failed"; }
            "$CROSS-objdump" -d -l --no-show-raw-insn "$so" >"$d/$name.objdump"
            # the .pyx and the .pxd/.pxi beside it: hot loops live in all of them
            sources=(--pyx "$pyx")
            for src in "$(dirname "$pyx")"/*.pxd "$(dirname "$pyx")"/*.pxi; do
                [[ -e $src ]] && sources+=(--pyx "$src")
            done
            "$PY" "$REPO/tools/neon_report.py" "${sources[@]}" --c "$c" --optinfo "$d/$name.optinfo" \
                --objdump "$d/$name.objdump" --label "$cpu" --json "$d/$name.neon.json" </dev/null | tee -a "$d/neon.txt" \
                || fail "$cpu: not every hot loop of $name is NEON-vectorized"
        done <"$WORK/exts.tsv"
    done
    # the oldest CPU's build must run on every Pi: no ARMv8.1+ instructions anywhere in it
    local oldest=${CPUS[0]} bad
    for so in $(find "$WORK/$oldest/tree" -name "*$TARGET_EXT"); do
        bad=$("$CROSS-objdump" -d --no-show-raw-insn "$so" | grep -E -c "^\s*[0-9a-f]+:\s+$V81_INSNS\b" || true)
        echo "$oldest build ${so##*/}: $bad ARMv8.1+ instructions (LSE atomics, RCpc, dot product)" \
            >>"$WORK/report/isa.txt"
        ((bad == 0)) || fail "$oldest build ${so##*/} holds $bad ARMv8.1+ instructions: it would trap on $oldest"
    done
    log "aarch64 builds done"

    # 6a. agreement inputs and the x86-64 answers
    "$PY" "$REPO/tools/cross_agreement.py" gen --out "$WORK/cases.npz" --cases "$AGREEMENT_CASES" >/dev/null
    (cd "$WORK" && PYTHONPATH="$WORK/x86/tree" "$PY" "$REPO/tools/cross_agreement.py" run \
        --cases "$WORK/cases.npz" --out "$WORK/x86.npz") || die "x86-64 agreement run failed"
    cp "$REPO/tools/cross_agreement.py" "$WORK/cross_agreement.py"

    # 5 + 6b + 7. the runs: each aarch64 build on its own emulated CPU (with the suite if it is one
    # of $SUITE_CPUS, else the agreement run only), the oldest build on the newest CPU (agreement only), then the x86-64 levels natively; $JOBS at a time
    # (a qemu process emulates one CPU on one core).  A run is "<build> <emulated CPU> <suite>"
    # or "x86 <level>"; its reports are named <build>-on-<emu> or x86-<level>.
    local runs=() r running=0 build emu suite report level
    for cpu in "${CPUS[@]}"; do
        if [[ " $SUITE_CPUS " == *" $cpu "* ]]; then runs+=("$cpu $cpu 1"); else runs+=("$cpu $cpu 0"); fi
        make_launcher "$cpu"
    done
    ((${#CPUS[@]} > 1)) && runs+=("${CPUS[0]} ${CPUS[-1]} 0")
    for level in "${X86_LEVELS[@]}"; do runs+=("x86 $level"); done
    for r in "${runs[@]}"; do
        if ((running >= JOBS)); then
            wait -n || true
            running=$((running - 1))
        fi
        read -r build emu suite <<<"$r"
        if [[ $build == x86 ]]; then x86_level_run "$emu" & else emulated_run "$build" "$emu" "$suite" & fi
        running=$((running + 1))
    done
    wait
    for r in "${runs[@]}"; do  # reports in run order, whatever order the runs ended in
        read -r build emu suite <<<"$r"
        if [[ $build == x86 ]]; then report=x86-$emu; else report=$build-on-$emu; fi
        cat "$WORK/report/suite-$report.txt" >>"$WORK/report/suite.txt"
        cat "$WORK/report/agree-$report.txt" >>"$WORK/report/agree.txt"
    done

    # summary
    echo
    echo "==== aarch64 summary ($((SECONDS - START)) s) ===="
    for cpu in "${CPUS[@]}"; do
        echo "-- $cpu: hot loops (gcc 16-byte loop vectorization + SIMD in objdump)"
        sed -E 's/^\[[^]]*\] /   /' "$WORK/$cpu/neon.txt"
    done
    sed 's/^/-- /' "$WORK/report/isa.txt"
    echo "-- reduced suite (emulated aarch64; x86-64 levels natively)"
    sed 's/^/   /' "$WORK/report/suite.txt"
    echo "-- agreement with the x86-64 -march=native build"
    sed -E 's/^\[([^]]*)\] /   \1: /' "$WORK/report/agree.txt"
    if [[ -s $FAILURES_FILE ]]; then
        [[ "${SPECVERIFY_KEEP:-0}" == 1 ]] || { SPECVERIFY_KEEP=1; echo "(scratch kept for inspection)"; }
        echo "FAILED ($(wc -l <"$FAILURES_FILE")):"
        sed 's/^/   /' "$FAILURES_FILE"
        return 1
    fi
    echo "aarch64 check PASSED"
}

main "$@"
