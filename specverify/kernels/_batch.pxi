# Batched, ragged verification: many requests in one call, the GIL released, requests spread over
# helper threads (included by _kernels.pyx after _chain.pxi and _block.pxi, whose kernels it calls
# per request).
#
# Layout (vLLM model runner V2): request r owns draft tokens [cu[r], cu[r+1]) and target rows
# [cu[r] + r, cu[r+1] + r + 1) (K_r + 1 rows, the last its bonus row); draft rows, when given, are
# aligned with the draft tokens.  The entry copies every index it will use (cu, tokens, methods,
# draft presence, uniforms) into the call's own memory BEFORE validating it, so a caller mutating
# its arrays from another thread can never steer a loop that runs without bounds checks.
# Each request writes only its own output slots, so results do not depend on the thread count or
# the schedule.

from cpython.buffer cimport PyBUF_RECORDS
from libc.string cimport memcpy

# Per-request verification methods; a method's code is its index in BATCH_METHODS.  Every
# sampling method is a SamplingKernel (_chain.pxi) taking K_r + 1 uniforms.
cdef enum:
    METHOD_GREEDY = 0
    METHOD_TOKEN = 1
    METHOD_BLOCK = 2

BATCH_METHODS = ("greedy", "token", "block")
_METHOD_CODES = {name: code for code, name in enumerate(BATCH_METHODS)}


cdef struct _Batch:
    # Inputs (validated; indices are the call's own copies).
    Py_ssize_t n_requests
    Py_ssize_t n_tokens              # sum K_r
    Py_ssize_t n_uniforms            # sum over sampled requests of K_r + 1
    Py_ssize_t vocab
    Py_ssize_t width                 # K_max + 1: columns of the output
    const float* target              # [sum K_r + R, V] rows, target_stride floats apart
    Py_ssize_t target_stride
    const float* draft               # [sum K_r, V] rows or NULL
    Py_ssize_t draft_stride
    const int64_t* cu                # [R + 1]
    const int64_t* tokens            # [sum K_r]
    const uint8_t* methods           # [R] METHOD_* codes
    const uint8_t* has_draft         # [R] 1: request reads its draft rows; 0: one-hot draft
    const int64_t* uniform_start     # [R + 1] request r's uniforms are [start[r], start[r+1])
    const double* uniforms
    # Outputs, one slot (row) per request.
    int64_t* output                  # [R, width]
    int64_t* n_accepted              # [R]
    int* status                      # [R]
    Py_ssize_t* bad_row              # [R] row of the request (0..K_r) that a non-OK status names
    # Schedule (threads only): the i-th request claimed is claim_order[i]; NULL: in order.
    const Py_ssize_t* claim_order    # [R] or NULL


cdef void _verify_request(const _Batch* b, Py_ssize_t r) noexcept nogil:
    """Request r with the single-request kernel its method names; writes r's output row."""
    cdef Py_ssize_t k, n = 0, j
    cdef const float* target
    cdef const int64_t* tokens
    cdef const float* draft = NULL
    cdef int64_t* out
    cdef int64_t next_token = -1
    cdef int status
    cdef SamplingKernel sampler
    # Debug builds: the request, its rows, tokens, uniforms and output slots lie in the batch.
    check_index(r, b.n_requests)
    k = b.cu[r + 1] - b.cu[r]
    check_index(b.cu[r], b.n_tokens + 1)
    check_index(b.cu[r] + k, b.n_tokens + 1)    # tokens and draft rows [cu[r], cu[r] + k)
    check_index(k, b.width)                     # output slots 0..k
    check_index(b.cu[r] + r + k, b.n_tokens + b.n_requests)  # target rows [cu[r] + r, .. + k]
    target = b.target + (b.cu[r] + r) * b.target_stride
    tokens = b.tokens + b.cu[r]
    out = b.output + r * b.width
    sampler = _accept_block if b.methods[r] == METHOD_BLOCK else _accept
    b.bad_row[r] = -1
    if b.methods[r] == METHOD_GREEDY:
        status = _verify_greedy(target, b.target_stride, tokens, k, b.vocab, &n, &next_token,
                                &b.bad_row[r])
    else:
        if b.has_draft[r]:
            draft = b.draft + b.cu[r] * b.draft_stride
        check_index(b.uniform_start[r] + k, b.n_uniforms)  # uniforms [start[r], start[r] + k]
        status = sampler(target, b.target_stride, draft, b.draft_stride, tokens, k, b.vocab,
                         b.uniforms + b.uniform_start[r], &n, &next_token, &b.bad_row[r])
    b.status[r] = status
    if status != OK:
        n, next_token = 0, -1
    b.n_accepted[r] = n
    check_index(n, k + 1)
    for j in range(n):
        out[j] = tokens[j]
    out[n] = next_token
    for j in range(n + 1, b.width):
        out[j] = -1


cdef void _verify_request_task(void* batch, Py_ssize_t i) noexcept nogil:
    cdef const _Batch* b = <const _Batch*> batch
    if b.claim_order == NULL:
        _verify_request(b, i)
    else:
        check_index(b.claim_order[i], b.n_requests)
        _verify_request(b, b.claim_order[i])


cdef inline Py_ssize_t _rows_read(const _Batch* b, Py_ssize_t r) noexcept nogil:
    """The most rows request r can read: K_r + 1 target rows, and K_r draft rows if it has them
    and samples (greedy reads none)."""
    cdef Py_ssize_t k = b.cu[r + 1] - b.cu[r]
    return k + 1 + (k if b.has_draft[r] and b.methods[r] != METHOD_GREEDY else 0)


cdef Py_ssize_t* _largest_first(const _Batch* b) noexcept nogil:
    """The requests by decreasing ``_rows_read``, ties in request order: a counting sort,
    O(R + K_max).  Claimed in this order, the threads end together: the last claims are the
    smallest (in order, a large request claimed last keeps one thread busy alone; with R = 8 and
    K_r uniform in 0..8 that caps two threads at 1.86x on average, against 1.96x largest
    first).  NULL if out of memory (then in order)."""
    cdef Py_ssize_t n_weights = 2 * b.width, r, w, start = 0, count   # rows read < 2 * width
    cdef Py_ssize_t* order = <Py_ssize_t*> malloc((b.n_requests + n_weights) * sizeof(Py_ssize_t))
    cdef Py_ssize_t* first
    if order == NULL:
        return NULL
    first = order + b.n_requests    # first[n_weights - w]: where the requests reading w rows go
    for w in range(n_weights):
        first[w] = 0
    for r in range(b.n_requests):
        w = n_weights - _rows_read(b, r)
        check_index(w, n_weights)
        first[w] += 1
    for w in range(n_weights):
        count = first[w]
        first[w] = start
        start += count
    for r in range(b.n_requests):
        w = n_weights - _rows_read(b, r)
        check_index(first[w], b.n_requests)
        order[first[w]] = r
        first[w] += 1
    return order


def _claim_order(cu_num_draft_tokens, has_draft_probs, methods):
    """The order in which verify_batch's threads claim the requests (for the tests): int64 [R]
    from cu [R + 1] (int64), has_draft_probs [R] (bool) and methods [R] (BATCH_METHODS codes)."""
    # Buffers, not typed memoryviews: those bring atomic reference counts, which the Cortex-A72
    # build must not hold (tools/aarch64_check.sh checks it).
    cu_array = np.ascontiguousarray(cu_num_draft_tokens, dtype=np.int64)
    arrays = (cu_array, np.ascontiguousarray(has_draft_probs, dtype=np.uint8),
              np.ascontiguousarray(methods, dtype=np.uint8))
    cdef Py_buffer views[3]
    cdef _Batch b
    cdef Py_ssize_t r, held = 0
    cdef Py_ssize_t* order = NULL
    n_requests = cu_array.size - 1
    if n_requests < 0 or arrays[1].size != n_requests or arrays[2].size != n_requests:
        raise ValueError("cu_num_draft_tokens needs R + 1 entries, has_draft_probs and methods R")
    if n_requests == 0:
        return np.empty(0, dtype=np.int64)
    k = np.diff(cu_array)
    if cu_array[0] != 0 or (k < 0).any() or (arrays[2] >= len(BATCH_METHODS)).any():
        raise ValueError("cu_num_draft_tokens must rise from 0; methods must be method codes")
    try:
        for held in range(3):
            PyObject_GetBuffer(arrays[held], &views[held], PyBUF_RECORDS_RO)
        held = 3
        b.n_requests = n_requests
        b.width = int(k.max()) + 1
        b.cu = <const int64_t*> views[0].buf
        b.has_draft = <const uint8_t*> views[1].buf
        b.methods = <const uint8_t*> views[2].buf
        order = _largest_first(&b)
        if order == NULL:
            raise MemoryError()
        return np.array([order[r] for r in range(n_requests)], dtype=np.int64)
    finally:
        free(order)
        for r in range(held):
            PyBuffer_Release(&views[r])


cdef void _verify_requests(_Batch* b, int num_threads) noexcept nogil:
    """Every request of the batch; on num_threads > 1 the pool's threads claim them one at a
    time, largest first.  Each writes only its own slots: the results are the same for any
    thread count and schedule."""
    cdef Py_ssize_t r
    cdef Py_ssize_t* order
    cdef int done = 0
    if num_threads > 1:
        order = _largest_first(b)
        b.claim_order = order
        done = sv_parallel_for(_verify_request_task, b, b.n_requests, num_threads) == 0
        b.claim_order = NULL
        free(order)
    if not done:
        for r in range(b.n_requests):
            _verify_request(b, r)


# A small pool of helper threads that CLAIM requests one at a time from a shared counter, with the
# caller claiming too.  Unlike a fork-join region (OpenMP's prange), the caller never waits for a
# helper that has not started: it waits only for requests a helper has claimed and not finished.
# On a loaded machine a helper may wait a scheduler slice (tens of ms) to run; with a barrier the
# whole call waited for it (measured: median 44 ms instead of 1.8 ms for R = 64, V = 32000, load
# 11 on 2 cores); here the caller just does the work itself.  One job at a time: a second caller
# meanwhile runs on its own thread.  After fork() the child starts with no helpers.
#
# Waking a sleeping helper is slow on this virtual machine: it starts 18-25 us after the post, 30-75
# us once it has slept 1-10 ms, against 0.1-0.5 us for a helper still polling (tools/thread_probe.py,
# quiet machine).  So a helper that finished a job polls (a pause instruction per poll, lock
# released) for up to sv_pool.spin_ns before it sleeps: a call that follows within that window
# finds it awake on its own CPU.  The caller, waiting for a helper's last claimed request, polls
# the same way before it sleeps.
cdef extern from *:
    """
    #include <pthread.h>
    #include <signal.h>
    #include <stdint.h>
    #ifndef _GNU_SOURCE
    #define _GNU_SOURCE
    #endif
    #include <sched.h>
    #include <time.h>
    #if defined(__x86_64__) || defined(__i386__)
    #include <immintrin.h>
    #define SV_PAUSE() _mm_pause()
    #elif defined(__aarch64__)
    #define SV_PAUSE() __asm__ __volatile__("yield" ::: "memory")
    #else
    #define SV_PAUSE() ((void) 0)
    #endif

    typedef void (*sv_task)(void* context, Py_ssize_t index);

    #define SV_MAX_HELPERS 63

    static struct {
        pthread_mutex_t lock;
        pthread_cond_t wake;       /* helpers: a new job was posted */
        pthread_cond_t finished;   /* caller: the last in-flight request is done */
        int helpers;               /* helper threads started */
        int busy;                  /* a caller owns the pool */
        unsigned long generation;  /* jobs posted so far (written under lock, atomically) */
        sv_task task;              /* the current job (read under lock) */
        void* context;
        Py_ssize_t count, next, in_flight;  /* in_flight: written under lock, atomically */
        int wanted, joined;        /* helpers the job may use / that joined it */
        long long spin_ns;         /* how long a thread polls before it sleeps (atomic) */
        /* Per helper (index < helpers): its thread, the CPUs it may run on, whether it sleeps
           (in pthread_cond_wait) and whether a caller took the caller's CPU out of its mask. */
        pthread_t thread[SV_MAX_HELPERS];
        cpu_set_t allowed[SV_MAX_HELPERS];
        char asleep[SV_MAX_HELPERS], moved[SV_MAX_HELPERS];
    } sv_pool = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, PTHREAD_COND_INITIALIZER,
                 .spin_ns = 50000};

    static int sv_pool_atfork_registered = 0;

    /* The poll window: set (probes, tests), returns the previous one.  Setters take the pool's
       lock (readers load it atomically): an atomic exchange would compile, on aarch64, to a
       call into libgcc's outline atomics, whose LSE path the Cortex-A72 proof rejects. */
    static long long sv_pool_exchange_spin_ns(long long spin_ns) {
        long long previous;
        pthread_mutex_lock(&sv_pool.lock);
        previous = sv_pool.spin_ns;
        __atomic_store_n(&sv_pool.spin_ns, spin_ns, __ATOMIC_RELAXED);
        pthread_mutex_unlock(&sv_pool.lock);
        return previous;
    }

    static long long sv_now_ns(void) {
        struct timespec now;
        clock_gettime(CLOCK_MONOTONIC, &now);
        return (long long) now.tv_sec * 1000000000LL + now.tv_nsec;
    }

    /* A spinning thread's poll: a pause instruction, and every 32 polls a sched_yield (when this
       CPU is shared, e.g. on a loaded machine, the thread that would run the job gets it at
       once rather than after the spinner's time slice); false once sv_pool.spin_ns have passed
       since the first poll (*until = 0 before it). */
    static int sv_keep_spinning(long long* until, unsigned* polls) {
        if (*until == 0) {
            long long spin_ns = __atomic_load_n(&sv_pool.spin_ns, __ATOMIC_RELAXED);
            if (spin_ns <= 0) return 0;
            *until = sv_now_ns() + spin_ns;
        }
        SV_PAUSE();
        if ((++*polls & 31) != 0) return 1;
        sched_yield();
        return sv_now_ns() < *until;
    }

    static void sv_pool_reset_in_child(void) {
        pthread_mutex_init(&sv_pool.lock, NULL);
        pthread_cond_init(&sv_pool.wake, NULL);
        pthread_cond_init(&sv_pool.finished, NULL);
        sv_pool.helpers = 0;
        sv_pool.busy = 0;
        sv_pool.count = sv_pool.next = sv_pool.in_flight = 0;
    }

    /* Claim and run requests of job `generation` until none is left (lock held on entry/exit;
       a helper stops if a newer job was posted meanwhile: it joins that one properly). */
    static void sv_pool_drain(int helper, unsigned long generation) {
        while (sv_pool.next < sv_pool.count && sv_pool.generation == generation) {
            Py_ssize_t index = sv_pool.next++;
            sv_task task = sv_pool.task;
            void* context = sv_pool.context;
            if (helper) __atomic_store_n(&sv_pool.in_flight, sv_pool.in_flight + 1, __ATOMIC_RELAXED);
            pthread_mutex_unlock(&sv_pool.lock);
            task(context, index);
            pthread_mutex_lock(&sv_pool.lock);
            if (helper) {
                __atomic_store_n(&sv_pool.in_flight, sv_pool.in_flight - 1, __ATOMIC_RELEASE);
                if (sv_pool.in_flight == 0 && sv_pool.next >= sv_pool.count)
                    pthread_cond_signal(&sv_pool.finished);
            }
        }
    }

    static void* sv_pool_helper(void* index_as_pointer) {
        int me = (int) (intptr_t) index_as_pointer;
        sigset_t all;
        unsigned long seen = 0;
        sigfillset(&all);
        pthread_sigmask(SIG_BLOCK, &all, NULL);   /* signals are the main thread's business */
        pthread_mutex_lock(&sv_pool.lock);
        /* Started by a call that has posted its job by the time this lock is ours: join it. */
        seen = sv_pool.generation - 1;
        for (;;) {
            if (sv_pool.generation == seen) {
                long long until = 0;
                unsigned polls = 0;
                pthread_mutex_unlock(&sv_pool.lock);
                while (__atomic_load_n(&sv_pool.generation, __ATOMIC_ACQUIRE) == seen
                       && sv_keep_spinning(&until, &polls)) {}
                pthread_mutex_lock(&sv_pool.lock);
                while (sv_pool.generation == seen) {
                    sv_pool.asleep[me] = 1;
                    pthread_cond_wait(&sv_pool.wake, &sv_pool.lock);
                    sv_pool.asleep[me] = 0;
                }
            }
            if (sv_pool.moved[me]) {
                /* Woken off the caller's CPU: every CPU allowed again (no migration: this one is). */
                sv_pool.moved[me] = 0;
                pthread_setaffinity_np(pthread_self(), sizeof(cpu_set_t), &sv_pool.allowed[me]);
            }
            seen = sv_pool.generation;
            if (sv_pool.joined >= sv_pool.wanted) continue;
            sv_pool.joined++;
            sv_pool_drain(1, seen);
        }
        return NULL;
    }

    /* Sleeping helpers may not wake on the caller's CPU (lock held).  Measured on this 2-vCPU VM
       (tools/thread_probe.py): once the caller has slept a millisecond or more, the scheduler
       wakes the helper on the caller's own CPU in 96-100% of the jobs, where it runs only after
       the caller (up to 1.8 ms later) or in turns with it: no gain.  Taking that CPU out of a
       sleeping helper's mask makes the wake-up pick another; the helper restores its mask. */
    static void sv_pool_keep_off_callers_cpu(void) {
        int cpu = sched_getcpu(), i;
        cpu_set_t elsewhere;
        if (cpu < 0 || cpu >= CPU_SETSIZE) return;
        for (i = 0; i < sv_pool.helpers; i++) {
            if (!sv_pool.asleep[i] || sv_pool.moved[i] || !CPU_ISSET(cpu, &sv_pool.allowed[i])
                || CPU_COUNT(&sv_pool.allowed[i]) < 2)
                continue;
            elsewhere = sv_pool.allowed[i];
            CPU_CLR(cpu, &elsewhere);
            if (pthread_setaffinity_np(sv_pool.thread[i], sizeof(cpu_set_t), &elsewhere) == 0)
                sv_pool.moved[i] = 1;
        }
    }

    /* Run task(context, i) for i in [0, count) on the caller and up to threads - 1 helpers.
       Returns 0 when done, -1 (nothing run) when the pool is busy or no helper could start: the
       caller then runs the loop itself. */
    static int sv_parallel_for(sv_task task, void* context, Py_ssize_t count, int threads) {
        pthread_attr_t attr;
        pthread_mutex_lock(&sv_pool.lock);
        if (sv_pool.busy) {
            pthread_mutex_unlock(&sv_pool.lock);
            return -1;
        }
        if (!sv_pool_atfork_registered) {
            pthread_atfork(NULL, NULL, sv_pool_reset_in_child);
            sv_pool_atfork_registered = 1;
        }
        if (threads - 1 > SV_MAX_HELPERS) threads = SV_MAX_HELPERS + 1;
        if (sv_pool.helpers < threads - 1) {
            pthread_attr_init(&attr);
            pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
            while (sv_pool.helpers < threads - 1) {
                int me = sv_pool.helpers;
                /* A new thread inherits the caller's CPUs: those are the helper's for good. */
                if (pthread_getaffinity_np(pthread_self(), sizeof(cpu_set_t), &sv_pool.allowed[me]) != 0)
                    CPU_ZERO(&sv_pool.allowed[me]);   /* unknown: never moved */
                sv_pool.asleep[me] = sv_pool.moved[me] = 0;
                if (pthread_create(&sv_pool.thread[me], &attr, sv_pool_helper,
                                   (void*) (intptr_t) me) != 0)
                    break;
                sv_pool.helpers++;
            }
            pthread_attr_destroy(&attr);
        }
        if (sv_pool.helpers == 0) {
            pthread_mutex_unlock(&sv_pool.lock);
            return -1;
        }
        sv_pool.busy = 1;
        sv_pool.task = task;
        sv_pool.context = context;
        sv_pool.count = count;
        sv_pool.next = 0;
        sv_pool.in_flight = 0;
        sv_pool.joined = 0;
        sv_pool.wanted = threads - 1;
        __atomic_store_n(&sv_pool.generation, sv_pool.generation + 1, __ATOMIC_RELEASE);
        sv_pool_keep_off_callers_cpu();
        pthread_cond_broadcast(&sv_pool.wake);   /* no system call when every helper spins */
        sv_pool_drain(0, sv_pool.generation);
        if (sv_pool.in_flight > 0) {
            /* The last requests are a helper's: poll for them a while before sleeping. */
            long long until = 0;
            unsigned polls = 0;
            pthread_mutex_unlock(&sv_pool.lock);
            while (__atomic_load_n(&sv_pool.in_flight, __ATOMIC_ACQUIRE) > 0
                   && sv_keep_spinning(&until, &polls)) {}
            pthread_mutex_lock(&sv_pool.lock);
            while (sv_pool.in_flight > 0) pthread_cond_wait(&sv_pool.finished, &sv_pool.lock);
        }
        /* Exhausted and nothing in flight: a helper waking late finds no request to claim. */
        sv_pool.busy = 0;
        pthread_mutex_unlock(&sv_pool.lock);
        return 0;
    }
    """
    ctypedef void (*sv_task)(void* context, Py_ssize_t index) noexcept nogil
    int sv_parallel_for(sv_task task, void* context, Py_ssize_t count, int threads) noexcept nogil


# Probes of the pool (tools/thread_probe.py): how long a sleeping or spinning helper takes to start
# a posted job, and the read bandwidth of one thread against the pool's.
cdef extern from *:
    """
    typedef struct {
        pthread_t caller;
        long long helper_started;  /* sv_now_ns() when a helper began its request; 0: not yet */
        long long deadline;
        int caller_cpu, helper_cpu;
    } sv_wake_probe;

    /* The caller's request polls until a helper has started the other one (or the deadline). */
    static void sv_wake_probe_task(void* context, Py_ssize_t index) {
        sv_wake_probe* probe = (sv_wake_probe*) context;
        (void) index;
        if (!pthread_equal(pthread_self(), probe->caller)) {
            probe->helper_cpu = sched_getcpu();
            __atomic_store_n(&probe->helper_started, sv_now_ns(), __ATOMIC_RELEASE);
            return;
        }
        probe->caller_cpu = sched_getcpu();
        while (__atomic_load_n(&probe->helper_started, __ATOMIC_ACQUIRE) == 0
               && sv_now_ns() < probe->deadline)
            SV_PAUSE();
    }

    /* ns from posting a two-request job to a helper starting its request; -1: no helper within
       timeout_ns; -2: the pool was busy (another caller). */
    static long long sv_wake_latency_ns(long long timeout_ns, int* same_cpu) {
        sv_wake_probe probe;
        long long posted = sv_now_ns();
        probe.caller = pthread_self();
        probe.helper_started = 0;
        probe.deadline = posted + timeout_ns;
        probe.caller_cpu = probe.helper_cpu = -1;
        if (sv_parallel_for(sv_wake_probe_task, &probe, 2, 2) != 0) return -2;
        *same_cpu = probe.caller_cpu == probe.helper_cpu;
        return probe.helper_started ? probe.helper_started - posted : -1;
    }

    typedef struct {
        const uint32_t* data;
        Py_ssize_t n, chunk;
        uint32_t* results;   /* one per chunk: no two threads write one word */
        uint8_t* by_helper;  /* one per chunk: 1 if a helper read it */
        pthread_t caller;
    } sv_read_probe;

    static void sv_read_probe_task(void* context, Py_ssize_t index) {
        sv_read_probe* probe = (sv_read_probe*) context;
        Py_ssize_t start = index * probe->chunk, end = start + probe->chunk, i;
        uint32_t bits = 0;
        if (end > probe->n) end = probe->n;
        for (i = start; i < end; i++) bits |= probe->data[i];
        probe->results[index] = bits;
        probe->by_helper[index] = !pthread_equal(pthread_self(), probe->caller);
    }
    """
    long long sv_wake_latency_ns(long long timeout_ns, int* same_cpu) noexcept nogil
    long long sv_now_ns() noexcept nogil
    ctypedef unsigned long pthread_t   # opaque here: only copied
    ctypedef struct sv_read_probe:
        const uint32_t* data
        Py_ssize_t n, chunk
        uint32_t* results
        uint8_t* by_helper
        pthread_t caller
    pthread_t pthread_self() noexcept nogil
    void sv_read_probe_task(void* context, Py_ssize_t index) noexcept nogil
    long long sv_pool_exchange_spin_ns(long long spin_ns) noexcept nogil
    long long sv_pool_spin_ns "sv_pool.spin_ns"   # read only (the setter is atomic)


def _pool_wake_latency_ns(double timeout_s=0.1):
    """(ns, same_cpu): nanoseconds from posting a job to a helper thread starting it (the helper
    asleep or spinning, as the time since the last job left it; -1 if none started within
    timeout_s, -2 if another caller held the pool), and whether the helper started on the CPU
    the caller was on."""
    cdef long long timeout_ns = <long long> (timeout_s * 1e9), latency
    cdef int same_cpu = 0
    with nogil:
        latency = sv_wake_latency_ns(timeout_ns, &same_cpu)
    return latency, bool(same_cpu)


def _pool_spin_ns(spin_ns=None):
    """How long helpers (and a caller waiting for them) poll before sleeping, in ns; sets it when
    given (probes only: 0 makes every thread sleep at once).  Returns the previous value."""
    if spin_ns is None:
        return sv_pool_spin_ns
    return sv_pool_exchange_spin_ns(max(int(spin_ns), 0))


def _pool_read_ns(data, int threads, Py_ssize_t chunk_bytes=1 << 20):
    """(ns, bits, helper_chunks): time to OR every 32-bit word of the contiguous buffer `data` on
    `threads` threads (the pool's claiming, chunk_bytes per claim), the OR (so the read is not
    elided) and how many of the chunks helpers read."""
    cdef Py_buffer view
    cdef sv_read_probe probe
    cdef Py_ssize_t chunks, i
    cdef long long start, end
    cdef uint32_t bits = 0
    cdef Py_ssize_t helper_chunks = 0
    PyObject_GetBuffer(data, &view, PyBUF_RECORDS_RO)
    try:
        probe.data = <const uint32_t*> view.buf
        probe.n = view.len // 4
        probe.chunk = max(chunk_bytes // 4, 1)
        chunks = (probe.n + probe.chunk - 1) // probe.chunk
        probe.results = <uint32_t*> malloc(max(chunks, 1) * (sizeof(uint32_t) + 1))
        if probe.results == NULL:
            raise MemoryError()
        probe.by_helper = <uint8_t*> (probe.results + max(chunks, 1))
        probe.caller = pthread_self()
        with nogil:
            start = sv_now_ns()
            if threads <= 1 or sv_parallel_for(sv_read_probe_task, &probe, chunks, threads) != 0:
                for i in range(chunks):
                    sv_read_probe_task(&probe, i)
            end = sv_now_ns()
        for i in range(chunks):
            bits |= probe.results[i]
            helper_chunks += probe.by_helper[i]
        free(probe.results)
        return end - start, bits, helper_chunks
    finally:
        PyBuffer_Release(&view)


# ---------------------------------------------------------------------------------------------
# Entry
# ---------------------------------------------------------------------------------------------

cdef int _default_threads = 0

# With num_threads=None, one more thread only per this many target elements the batch may read
# (2 MiB of float32: 23 us of reading from L2 on one thread at 92 GB/s, 70 us from DRAM at 30
# GB/s): a sleeping helper starts 18-75 us after the call posts its job (tools/thread_probe.py),
# so a smaller batch is mostly done by then, and the helper's poll after it would burn a CPU for
# nothing.
cdef Py_ssize_t MIN_ELEMENTS_PER_THREAD = 1 << 19
# Helper threads are kept for the process's life: never more than this many in all.
cdef int MAX_THREADS = 64   # SV_MAX_HELPERS + 1


def default_num_threads():
    """Threads ``verify_batch`` uses when not told: OMP_NUM_THREADS if it is a positive integer,
    else the CPUs this process may run on.  Read once, at the first call."""
    global _default_threads
    if _default_threads == 0:
        import os
        text = os.environ.get("OMP_NUM_THREADS", "").split(",")[0].strip()
        try:
            _default_threads = max(int(text), 0)
        except ValueError:
            _default_threads = 0
        if _default_threads == 0:
            try:
                _default_threads = len(os.sched_getaffinity(0))
            except (AttributeError, OSError):
                _default_threads = os.cpu_count() or 1
    return _default_threads


cdef Py_ssize_t _request_of(const int64_t* cu, Py_ssize_t n_requests, Py_ssize_t i) noexcept:
    """The request owning draft token i (error messages only): the last r with cu[r] <= i."""
    cdef Py_ssize_t lo = 0, hi = n_requests - 1, mid
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if cu[mid] <= i:
            lo = mid
        else:
            hi = mid - 1
    return lo


cdef object _batch_rows(object x, str name, Py_ssize_t rows, Py_ssize_t cols, str why, Rows* out,
                        _Held held):
    """Validated float32 rows whose count is fixed by cu_num_draft_tokens (the message says so)."""
    if not _read_rows(x, out, held) or out.cols == 0 or (cols >= 0 and out.cols != cols):
        x = _inputs.float_rows(x, name, cols=None if cols < 0 else cols)
        if not _read_rows(x, out, held):
            _unreadable(name)
    if out.rows != rows:
        raise ValueError(f"{name} has {out.rows} rows but cu_num_draft_tokens implies {why} = {rows}")
    return x


cdef int _copy_bytes(object array, uint8_t* into, Py_ssize_t n) except -1:
    """Copy n bytes out of a contiguous uint8 array that _inputs made (the call's own copy)."""
    cdef Py_buffer view
    PyObject_GetBuffer(array, &view, PyBUF_RECORDS_RO)
    try:
        if view.len != n or view.itemsize != 1:
            _unreadable("a per-request array")
        memcpy(into, view.buf, n)
    finally:
        PyBuffer_Release(&view)
    return 0


cdef int _read_methods(object method, Py_ssize_t n_requests, uint8_t* codes) except -1:
    """Per-request method codes: one name for all, a sequence of names, or an integer array."""
    cdef Py_ssize_t r
    cdef int code
    if isinstance(method, str):
        code = _METHOD_CODES.get(method, -1)
        if code < 0:
            raise ValueError(f"method must be one of {BATCH_METHODS}, got {method!r}")
        for r in range(n_requests):
            codes[r] = code
        return 0
    _copy_bytes(_inputs.batch_methods(method, n_requests, _METHOD_CODES), codes, n_requests)
    return 0


cdef int _read_draft_presence(object has_draft_probs, object draft_probs, Py_ssize_t n_requests,
                              uint8_t* has_draft) except -1:
    cdef Py_ssize_t r
    if has_draft_probs is None:
        for r in range(n_requests):
            has_draft[r] = draft_probs is not None
        return 0
    _copy_bytes(_inputs.batch_mask(has_draft_probs, n_requests, "has_draft_probs"), has_draft,
                n_requests)
    if draft_probs is None:
        for r in range(n_requests):
            if has_draft[r]:
                raise ValueError(f"has_draft_probs[{r}] is True but draft_probs is None")
    return 0


cdef int _fill_uniforms(object generator, object generators, object uniforms, _Batch* b,
                        Py_ssize_t total, double* into) except -1:
    """The batch's uniforms, in request order, into the call's own memory."""
    cdef const char* raw
    cdef const double* u
    cdef Py_ssize_t n, r, i, count
    cdef _Held held
    given = (generator is not None) + (generators is not None) + (uniforms is not None)
    if given > 1:
        raise TypeError("pass at most one of generator, generators and uniforms")
    if generators is not None:
        if not isinstance(generators, (list, tuple)) or len(generators) != b.n_requests:
            got = len(generators) if isinstance(generators, (list, tuple)) else type(generators).__name__
            raise ValueError(f"generators must be a list of one generator per request "
                             f"(R = {b.n_requests}), got {got}")
        for r in range(b.n_requests):
            count = b.uniform_start[r + 1] - b.uniform_start[r]
            if count == 0:
                continue  # a greedy request draws nothing: its generator is not advanced
            held = _Held()
            try:
                _uniforms(generators[r], None, count, &u, held)
            except (TypeError, ValueError) as error:
                raise type(error)(f"generators[{r}]: {error}") from None
            check_index(b.uniform_start[r] + count - 1, total)
            memcpy(into + b.uniform_start[r], u, count * sizeof(double))
        return 0
    if total == 0:
        return 0  # nothing to draw (all greedy); a generator given is not advanced
    if uniforms is None:
        uniforms = _inputs.draw_uniforms(generator, total)  # one draw for the whole batch
        held = _Held()
        if not _read_vector(uniforms, b'f', 8, &raw, &n, held) or n != total:
            _unreadable("uniforms drawn from generator")
        memcpy(into, raw, total * sizeof(double))
        return 0
    held = _Held()
    if not _read_vector(uniforms, b'f', 8, &raw, &n, held) or n != total:
        uniforms = _inputs.uniforms_float64(uniforms, total, what="K_r + 1 per sampled request, "
                                            "0 per greedy one")
        if not _read_vector(uniforms, b'f', 8, &raw, &n, held):
            _unreadable("uniforms")
    memcpy(into, raw, total * sizeof(double))
    for i in range(total):
        if not (0.0 <= into[i] < 1.0):  # also catches NaN
            raise ValueError(f"uniforms must lie in [0, 1) (uniforms[{i}] = {into[i]})")
    return 0


cdef int _raise_request_status(const _Batch* b, Py_ssize_t r, object target_probs,
                               object draft_probs) except -1:
    """The exception for request r's non-OK status, naming the request and the row."""
    cdef int status = b.status[r]
    cdef Py_ssize_t row = b.bad_row[r]
    cdef Py_ssize_t k = b.cu[r + 1] - b.cu[r]
    draft_status = status == BAD_DRAFT_VALUES or status == ZERO_DRAFT_MASS
    global_row = b.cu[r] + row if draft_status else b.cu[r] + r + row
    try:
        _inputs.raise_kernel_status(STATUS_NAMES[status], global_row, target_probs, draft_probs)
    except (ValueError, MemoryError) as error:
        rows = f"{k} draft rows" if draft_status else f"{k + 1} target rows"
        raise type(error)(f"request {r} (row {row} of its {rows}): {error}; no output returned") \
            from None
    return -1


def verify_batch(target_probs, draft_probs, draft_tokens, cu_num_draft_tokens, method="token",
                 has_draft_probs=None, generator=None, generators=None, uniforms=None,
                 num_threads=None):
    """See specverify.verify_batch."""
    return _verify_batch_entry(target_probs, draft_probs, draft_tokens, cu_num_draft_tokens,
                               method, has_draft_probs, generator, generators, uniforms,
                               num_threads, True)


def convert_only_verify_batch(target_probs, draft_probs, draft_tokens, cu_num_draft_tokens,
                              method="token", has_draft_probs=None, generator=None,
                              generators=None, uniforms=None, num_threads=None):
    """verify_batch without its kernels: the argument handling alone (call-overhead benchmark)."""
    return _verify_batch_entry(target_probs, draft_probs, draft_tokens, cu_num_draft_tokens,
                               method, has_draft_probs, generator, generators, uniforms,
                               num_threads, False)


cdef object _verify_batch_entry(object target_probs, object draft_probs, object draft_tokens,
                                object cu_num_draft_tokens, object method, object has_draft_probs,
                                object generator, object generators, object uniforms,
                                object num_threads, bint run):
    cdef _Held held = _Held()
    cdef _Batch b
    cdef Rows target, draft
    cdef const int64_t* cu_given
    cdef const int64_t* tokens_given
    cdef Py_ssize_t n_cu, n_tokens, n_requests, r, i, k, k_max = 0, total = 0
    cdef int64_t* cu
    cdef int64_t* tokens
    cdef int64_t* uniform_start
    cdef double* uniforms_own
    cdef uint8_t* methods
    cdef uint8_t* has_draft
    cdef char* memory = NULL
    cdef int threads = 1
    cdef Py_buffer out_view, accepted_view
    cdef Py_ssize_t ints, per_request
    _torch_seen()
    cu_num_draft_tokens = _tokens(cu_num_draft_tokens, "cu_num_draft_tokens", &cu_given, &n_cu, held)
    if n_cu < 1:
        raise ValueError("cu_num_draft_tokens must hold R + 1 offsets starting at 0, got none")
    draft_tokens = _tokens(draft_tokens, "draft_tokens", &tokens_given, &n_tokens, held)
    n_requests = n_cu - 1
    if num_threads is not None:
        threads = min(_inputs.thread_count(num_threads), MAX_THREADS)

    # The call's own memory: int64 offsets, tokens and uniform starts, per-request statuses and
    # rows, then the uniforms (counted below) and the byte-wide per-request flags.
    ints = (n_cu + n_tokens + n_cu) * sizeof(int64_t)
    per_request = n_requests * (sizeof(int) + sizeof(Py_ssize_t))
    memory = <char*> malloc(ints + per_request + 2 * n_requests + 8)
    if memory == NULL:
        raise MemoryError()
    try:
        cu = <int64_t*> memory
        tokens = cu + n_cu
        uniform_start = tokens + n_tokens
        b.bad_row = <Py_ssize_t*> (uniform_start + n_cu)
        b.status = <int*> (b.bad_row + n_requests)
        methods = <uint8_t*> (b.status + n_requests)
        has_draft = methods + n_requests
        memcpy(cu, cu_given, n_cu * sizeof(int64_t))
        memcpy(tokens, tokens_given, n_tokens * sizeof(int64_t))

        # Offsets: a leading 0, non-decreasing, ending at the number of draft tokens.
        if cu[0] != 0:
            raise ValueError(f"cu_num_draft_tokens must start at 0 (a leading 0, R + 1 entries), "
                             f"got cu_num_draft_tokens[0] = {cu[0]}")
        for r in range(n_requests):
            k = cu[r + 1] - cu[r]
            if k < 0:
                raise ValueError(f"cu_num_draft_tokens must be non-decreasing: "
                                 f"cu_num_draft_tokens[{r + 1}] = {cu[r + 1]} < "
                                 f"cu_num_draft_tokens[{r}] = {cu[r]} (request {r})")
            k_max = max(k_max, k)
        if cu[n_requests] != n_tokens:
            raise ValueError(f"cu_num_draft_tokens[-1] = {cu[n_requests]} but draft_tokens holds "
                             f"{n_tokens} tokens")

        _read_methods(method, n_requests, methods)
        _read_draft_presence(has_draft_probs, draft_probs, n_requests, has_draft)
        target_probs = _batch_rows(target_probs, "target_probs", n_tokens + n_requests, -1,
                                   "sum(K_r) + R", &target, held)
        if num_threads is None:  # the default: as many as the batch's size is worth
            threads = min(default_num_threads(),
                          max(1, (n_tokens + n_requests) * target.cols // MIN_ELEMENTS_PER_THREAD))
        if draft_probs is not None:
            draft_probs = _batch_rows(draft_probs, "draft_probs", n_tokens, target.cols,
                                      "sum(K_r)", &draft, held)
        else:
            draft.data, draft.stride = NULL, 0
        for i in range(n_tokens):
            if tokens[i] < 0 or tokens[i] >= target.cols:
                r = _request_of(cu, n_requests, i)
                raise IndexError(f"draft_tokens[{i}] = {tokens[i]} (request {r}, position "
                                 f"{i - cu[r]}) is not a token id in [0, {target.cols})"
                                 + (": -1 padding is not a draft token; give K_r instead"
                                    if tokens[i] == -1 else ""))

        # Uniforms: K_r + 1 per sampled request (token or block), none per greedy one, in order.
        for r in range(n_requests):
            uniform_start[r] = total
            if methods[r] != METHOD_GREEDY:
                total += cu[r + 1] - cu[r] + 1
        uniform_start[n_requests] = total
        uniforms_own = <double*> malloc(max(total, 1) * sizeof(double))
        if uniforms_own == NULL:
            raise MemoryError()
        try:
            b.n_requests, b.vocab, b.width = n_requests, target.cols, k_max + 1
            b.n_tokens, b.n_uniforms = n_tokens, total
            b.cu, b.tokens, b.methods, b.has_draft = cu, tokens, methods, has_draft
            b.uniform_start, b.uniforms = uniform_start, uniforms_own
            b.claim_order = NULL
            _fill_uniforms(generator, generators, uniforms, &b, total, uniforms_own)
            if not run:
                return None
            b.target, b.target_stride = <const float*> target.data, target.stride
            b.draft, b.draft_stride = <const float*> draft.data, draft.stride
            output = np.empty((n_requests, k_max + 1), dtype=np.int64)
            n_accepted = np.empty(n_requests, dtype=np.int64)
            PyObject_GetBuffer(output, &out_view, PyBUF_RECORDS)
            b.output = <int64_t*> out_view.buf
            PyBuffer_Release(&out_view)  # the arrays own their memory; the pointers stay valid
            PyObject_GetBuffer(n_accepted, &accepted_view, PyBUF_RECORDS)
            b.n_accepted = <int64_t*> accepted_view.buf
            PyBuffer_Release(&accepted_view)
            threads = max(1, min(threads, n_requests))
            with nogil:
                _verify_requests(&b, threads)
            for r in range(n_requests):
                if b.status[r] != OK:
                    _raise_request_status(&b, r, target_probs, draft_probs)
            return output, n_accepted
        finally:
            free(uniforms_own)
    finally:
        free(memory)
