# Argument readers shared by every op family's entry points (included by _kernels.pyx).
#
# The common case (float32 ndarray or CPU tensor with unit inner stride, int64 tokens, a numpy or
# torch generator) is recognized here from C descriptions of the arguments (the buffer protocol
# for ndarrays, DLPack for tensors); everything else goes through ``specverify.kernels._inputs``, which
# validates with messages that name the argument and converts, and whose result then takes the
# same road.  One mechanism, no copy unless needed.

STATUS_NAMES = {
    BAD_TARGET_VALUES: "bad_target_values",
    BAD_DRAFT_VALUES: "bad_draft_values",
    ZERO_TARGET_MASS: "zero_target_mass",
    ZERO_DRAFT_MASS: "zero_draft_mass",
    BAD_SCORES: "bad_scores",
    NO_FINITE_SCORE: "no_finite_score",
    NO_MEMORY: "no_memory",
}


cdef int _raise_status(int status, Py_ssize_t bad_row, object target, object draft) except -1:
    """Raise the exception that names the argument and row of a kernel's non-OK status."""
    _inputs.raise_kernel_status(STATUS_NAMES[status], bad_row, target, draft)
    return -1


# DLPack's C description of a tensor (the layout of dlpack.h, which torch ships; only the fields
# read here are named).  A tensor attribute costs ~50-90 ns through Python; DLPack gives them all
# in one C call.
cdef extern from *:
    """
    typedef struct { int32_t device_type; int32_t device_id; } sv_DLDevice;
    typedef struct { uint8_t code; uint8_t bits; uint16_t lanes; } sv_DLDataType;
    typedef struct {
        void* data; sv_DLDevice device; int32_t ndim; sv_DLDataType dtype;
        int64_t* shape; int64_t* strides; uint64_t byte_offset;
    } sv_DLTensor;
    typedef struct {
        sv_DLTensor dl_tensor; void* manager_ctx; void (*deleter)(void* self);
    } sv_DLManagedTensor;
    typedef int (*sv_DLTensorFromPyObject)(void* py_object, sv_DLTensor* out);
    typedef struct {
        uint32_t major; uint32_t minor; void* prev_api;
        void* managed_tensor_allocator; void* managed_tensor_from_py_object_no_sync;
        void* managed_tensor_to_py_object_no_sync;
        sv_DLTensorFromPyObject dltensor_from_py_object_no_sync;
        void* current_work_stream;
    } sv_DLPackExchangeAPI;
    #define SV_DLPACK_CPU 1
    #define SV_DLPACK_CUDA_HOST 3
    #define SV_DLPACK_INT 0
    #define SV_DLPACK_FLOAT 2
    """
    ctypedef struct DLDevice "sv_DLDevice":
        int32_t device_type
    ctypedef struct DLDataType "sv_DLDataType":
        uint8_t code
        uint8_t bits
        uint16_t lanes
    ctypedef struct DLTensor "sv_DLTensor":
        void* data
        DLDevice device
        int32_t ndim
        DLDataType dtype
        int64_t* shape
        int64_t* strides
        uint64_t byte_offset
    ctypedef struct DLManagedTensor "sv_DLManagedTensor":
        DLTensor dl_tensor
    ctypedef int (*DLTensorFromPyObject "sv_DLTensorFromPyObject")(void* py_object, DLTensor* out)
    ctypedef struct DLPackExchangeAPI "sv_DLPackExchangeAPI":
        uint32_t major
        DLTensorFromPyObject dltensor_from_py_object_no_sync
    enum:
        DLPACK_CPU "SV_DLPACK_CPU"
        DLPACK_CUDA_HOST "SV_DLPACK_CUDA_HOST"
        DLPACK_INT "SV_DLPACK_INT"
        DLPACK_FLOAT "SV_DLPACK_FLOAT"


# What the readers need of a tensor of rank <= 2 (shape and strides in elements).
cdef struct TensorView:
    const char* data
    int ndim
    uint8_t code       # DLPack dtype code: DLPACK_INT, DLPACK_FLOAT, ...
    uint8_t bits
    Py_ssize_t shape[2]
    Py_ssize_t strides[2]


# PyObject_GetBuffer without Cython's exception check: a refused buffer (datetime64, ...) only
# means "not the fast path".
cdef extern from "Python.h":
    int PyObject_GetBuffer_noexcept "PyObject_GetBuffer"(object x, Py_buffer* view, int flags) noexcept
    char* PyByteArray_AS_STRING(object block) noexcept


cdef object _ndarray = np.ndarray
cdef object _numpy_generator = np.random.Generator
cdef object _tensor = None  # torch.Tensor, torch.float64, ... once the caller has imported torch
cdef object _torch_float64 = None
cdef object _torch_generator = None
cdef object _torch_empty = None
cdef object _torch_empty_like = None
cdef object _to_dlpack = None  # torch.utils.dlpack.to_dlpack, where the exchange API is missing
cdef DLTensorFromPyObject _dltensor_from_tensor = NULL  # torch's DLPack exchange API (torch >= 2.10)
cdef object _per_thread = threading.local()  # scratch tensors for drawn uniforms


cdef bint _torch_seen() except -1:
    """Cache torch's types once the caller has imported torch (we never import it here)."""
    global _tensor, _torch_float64, _torch_generator, _torch_empty, _torch_empty_like
    if _tensor is not None:
        return True
    torch = sys.modules.get("torch")
    if torch is None or not hasattr(torch, "Tensor"):
        return False
    _torch_float64 = torch.float64
    _torch_generator, _torch_empty, _torch_empty_like = torch.Generator, torch.empty, torch.empty_like
    _tensor = torch.Tensor
    _tensor_route("exchange" if _exchange_api_reader() != NULL else "capsule")
    return True


def _tensor_route(route=None):
    """Which DLPack producer describes tensors: "exchange" (torch's C exchange API, no allocation)
    or "capsule" (torch.utils.dlpack.to_dlpack, every torch version).  With ``route`` given, use
    that one from now on (tests run both).  None until torch has been seen."""
    global _to_dlpack, _dltensor_from_tensor
    if not _torch_seen():
        return None
    if route == "capsule":
        from torch.utils.dlpack import to_dlpack as _to_dlpack
        _dltensor_from_tensor = NULL
    elif route == "exchange":
        _dltensor_from_tensor = _exchange_api_reader()
        if _dltensor_from_tensor == NULL:
            raise RuntimeError("this torch has no DLPack exchange API")
    elif route is not None:
        raise ValueError(f"route must be 'exchange' or 'capsule', got {route!r}")
    return "exchange" if _dltensor_from_tensor != NULL else "capsule"


cdef DLTensorFromPyObject _exchange_api_reader():
    """torch's dltensor_from_py_object_no_sync (DLPack 1.x exchange API), or NULL."""
    cdef DLPackExchangeAPI* api
    capsule = getattr(_tensor, "__dlpack_c_exchange_api__", None)
    if capsule is None or not PyCapsule_IsValid(capsule, b"dlpack_exchange_api"):
        return NULL
    api = <DLPackExchangeAPI*> PyCapsule_GetPointer(capsule, b"dlpack_exchange_api")
    return api.dltensor_from_py_object_no_sync if api.major == 1 else NULL


cdef bint _copy_view(const DLTensor* t, TensorView* out) noexcept:
    cdef int i
    if t.ndim > 2 or t.dtype.lanes != 1 or not (t.device.device_type == DLPACK_CPU
                                                or t.device.device_type == DLPACK_CUDA_HOST):
        return False
    out.data = <const char*> t.data + t.byte_offset
    out.ndim, out.code, out.bits = t.ndim, t.dtype.code, t.dtype.bits
    for i in range(t.ndim):
        out.shape[i] = t.shape[i]
    for i in reversed(range(t.ndim)):  # NULL strides (DLPack < 1.2): compact row-major
        out.strides[i] = (t.strides[i] if t.strides != NULL
                          else 1 if i == t.ndim - 1 else out.strides[i + 1] * out.shape[i + 1])
    return True


cdef bint _view_tensor(object x, TensorView* out) except -1:
    """Describe x, a torch.Tensor, if it is a CPU tensor of rank <= 2 whose memory holds its
    values as they read (no lazy negation: torch exports a negative view's memory as it is)."""
    cdef DLTensor described
    cdef bint ok
    if _dltensor_from_tensor != NULL:
        if _dltensor_from_tensor(<void*> x, &described) != 0:
            PyErr_Clear()  # e.g. a meta tensor: _inputs names the problem
            return False
        ok = _copy_view(&described, out)
    else:
        try:
            capsule = _to_dlpack(x)
        except Exception:
            return False
        ok = _copy_view(&(<DLManagedTensor*> PyCapsule_GetPointer(capsule, b"dltensor")).dl_tensor, out)
    return ok and not x.is_neg()


cdef enum:
    MAX_HELD = 16      # buffers one call holds at once: one per argument read in place
    OWNED_INLINE = 64  # 8-byte slots for the call's private copies (K token ids, K + 1 uniforms)


cdef struct Rows:
    const char* data
    Py_ssize_t rows
    Py_ssize_t cols
    Py_ssize_t stride  # elements between rows


cdef inline bint _overlap(const Rows* a, const Rows* b) noexcept:
    """Whether the address ranges of two float32 row sets intersect; an empty set never does.
    Row strides must be >= 0 (the readers' callers send a negative one down the conversion road,
    which copies)."""
    if a.rows == 0 or a.cols == 0 or b.rows == 0 or b.cols == 0:
        return False
    cdef const char* a_end = a.data + 4 * ((a.rows - 1) * a.stride + a.cols)
    cdef const char* b_end = b.data + 4 * ((b.rows - 1) * b.stride + b.cols)
    return a.data < b_end and b.data < a_end


@cython.no_gc  # holds only bytearrays: no reference cycle to collect, and one less cost per call
cdef class _Held:
    """What one call owns until it returns: the buffers acquired from its arguments (released
    when the call ends) and private copies of its token ids and uniforms.

    The copies are why a caller's thread that writes ``draft_tokens`` (or ``uniforms``) during the
    call cannot make a kernel index out of bounds: the values are copied once, the copy is
    validated, and only the copy reaches the nogil loops.  Small vectors live inline (no
    allocation); larger ones in bytearrays this object keeps alive.
    """
    cdef Py_buffer views[MAX_HELD]
    cdef int count
    cdef int64_t inline_slots[OWNED_INLINE]
    cdef Py_ssize_t inline_used
    cdef list spilled  # bytearrays holding copies too large for inline_slots

    cdef void* own_copy(self, const void* source, Py_ssize_t n) except NULL:
        """A copy of n 8-byte values (int64 or float64) in memory this call owns."""
        cdef char* copy
        if n <= OWNED_INLINE - self.inline_used:
            copy = <char*> &self.inline_slots[self.inline_used]
            self.inline_used += n
        else:
            block = bytearray(8 * n)
            if self.spilled is None:
                self.spilled = []
            self.spilled.append(block)
            copy = PyByteArray_AS_STRING(block)
        if n > 0:
            memcpy(copy, source, 8 * n)
        return copy

    def __dealloc__(self):
        cdef int i
        for i in range(self.count):
            PyBuffer_Release(&self.views[i])


cdef bint _get_buffer(object x, _Held held, Py_buffer** view) except -1:
    """Acquire x's buffer into the call's next slot; False (no exception) when x has none usable
    (e.g. datetime64 arrays, which the buffer protocol refuses: _inputs names the dtype)."""
    if held.count >= MAX_HELD:
        return False
    view[0] = &held.views[held.count]
    if PyObject_GetBuffer_noexcept(x, view[0], PyBUF_RECORDS_RO) < 0:
        PyErr_Clear()
        return False
    held.count += 1
    return True


cdef void _release_last(_Held held) noexcept:
    """Give back the buffer just acquired (it was not readable as needed): slots stay for the
    arguments actually read."""
    held.count -= 1
    PyBuffer_Release(&held.views[held.count])


cdef bint _read_rows(object x, Rows* out, _Held held) except -1:
    """Fill ``out`` if x is a 2-D float32 ndarray or CPU tensor (exact types, not subclasses),
    4-byte aligned, with unit inner stride.  Strides and address of an empty matrix do not matter."""
    cdef bint vector
    return _read_float32(x, out, held, False, False, &vector)


cdef bint _read_float32(object x, Rows* out, _Held held, bint vector_ok, bint writable,
                        bint* vector) except -1:
    """``_read_rows``, and also a 1-D float32 vector [n] as the one row [1, n] when ``vector_ok``
    (``vector`` tells which it was); with ``writable``, a read-only ndarray is refused."""
    cdef Py_buffer* view
    cdef TensorView tensor
    cdef int ndim
    cdef Py_ssize_t rows, cols, inner, row_stride
    cdef uintptr_t address
    if type(x) is _ndarray:
        if not _get_buffer(x, held, &view):
            return False
        ndim = view.ndim
        if ((ndim != 2 and not (ndim == 1 and vector_ok)) or view.format == NULL
                or strcmp(view.format, b"f") != 0 or (writable and view.readonly)):
            _release_last(held)
            return False
        rows = view.shape[0] if ndim == 2 else 1
        cols = view.shape[ndim - 1]
        inner = view.strides[ndim - 1]
        row_stride = view.strides[0] if ndim == 2 else 4 * cols
        address = <uintptr_t> view.buf
    elif _tensor is not None and type(x) is _tensor:
        if (not _view_tensor(x, &tensor) or tensor.code != DLPACK_FLOAT or tensor.bits != 32
                or (tensor.ndim != 2 and not (tensor.ndim == 1 and vector_ok))):
            return False
        ndim = tensor.ndim
        rows = tensor.shape[0] if ndim == 2 else 1
        cols = tensor.shape[ndim - 1]
        inner = 4 * tensor.strides[ndim - 1]
        row_stride = 4 * tensor.strides[0] if ndim == 2 else 4 * cols
        address = <uintptr_t> tensor.data
    else:
        return False
    if ((rows > 0 and cols > 1 and inner != 4) or (rows > 1 and row_stride % 4 != 0)
            or (rows > 0 and cols > 0 and address % 4 != 0)):
        if type(x) is _ndarray:
            _release_last(held)
        return False
    out.data, out.rows, out.cols, out.stride = <const char*> address, rows, cols, row_stride // 4
    vector[0] = ndim == 1
    return True


cdef int _unreadable(str name) except -1:
    raise RuntimeError(f"{name}: specverify could not read the array its own conversion produced "
                       "(a bug in specverify: please report it with the argument's type, dtype, "
                       "shape and strides)")


cdef object _rows(object x, str name, Py_ssize_t rows, Py_ssize_t cols, Rows* out, _Held held):
    """Validated float32 rows of x (converted by _inputs when needed); returns what owns them."""
    if _read_rows(x, out, held) and out.cols > 0 and out.rows == rows and (cols < 0 or out.cols == cols):
        return x
    x = _inputs.float_rows(x, name, rows=rows, cols=None if cols < 0 else cols)
    if not _read_rows(x, out, held):
        _unreadable(name)
    return x


cdef bint _read_vector(object x, char kind, Py_ssize_t itemsize, const char** data, Py_ssize_t* n,
                       _Held held) except -1:
    """1-D contiguous, aligned ndarray or CPU tensor (exact types) of int64 (kind 'i') or float64
    (kind 'f')."""
    cdef Py_buffer* view
    cdef TensorView tensor
    if type(x) is _ndarray:
        if not _get_buffer(x, held, &view):
            return False
        if (view.ndim != 1 or view.itemsize != itemsize or view.format == NULL
                or (view.shape[0] > 1 and view.strides[0] != itemsize)
                or (view.shape[0] > 0 and <uintptr_t> view.buf % itemsize != 0)
                or (kind == b'i' and not (strcmp(view.format, b"l") == 0
                                          or strcmp(view.format, b"q") == 0))
                or (kind == b'f' and strcmp(view.format, b"d") != 0)):
            _release_last(held)
            return False
        data[0], n[0] = <const char*> view.buf, view.shape[0]
        return True
    if _tensor is not None and type(x) is _tensor:
        if (not _view_tensor(x, &tensor) or tensor.ndim != 1 or tensor.bits != 8 * itemsize
                or tensor.code != (DLPACK_INT if kind == b'i' else DLPACK_FLOAT)
                or (tensor.shape[0] > 1 and tensor.strides[0] != 1)
                or (tensor.shape[0] > 0 and <uintptr_t> tensor.data % itemsize != 0)):
            return False
        data[0], n[0] = tensor.data, tensor.shape[0]
        return True
    return False


def _read_in_place(x):
    """Whether the readers would use x's own memory (a float32 matrix or an int64/float64
    vector): what the tests of alignment and subclass handling look at."""
    cdef _Held held = _Held()
    cdef Rows rows
    cdef const char* raw
    cdef Py_ssize_t n
    _torch_seen()
    return bool(_read_rows(x, &rows, held) or _read_vector(x, b'i', 8, &raw, &n, held)
                or _read_vector(x, b'f', 8, &raw, &n, held))


cdef object _tokens(object x, str name, const int64_t** data, Py_ssize_t* k, _Held held):
    """A 1-D int64 vector (token ids, parent indices) as the call's own copy: read in place or
    converted by _inputs, then copied into ``held``, so what is validated afterwards
    (``_check_token_range``) is exactly what the kernel reads, whatever another thread does to
    the caller's array meanwhile."""
    cdef const char* raw
    if not _read_vector(x, b'i', 8, &raw, k, held):
        x = _inputs.tokens_int64(x, name)
        if not _read_vector(x, b'i', 8, &raw, k, held):
            _unreadable(name)
    data[0] = <const int64_t*> held.own_copy(raw, k[0])
    return x


cdef int _check_token_range(str name, const int64_t* data, Py_ssize_t k, Py_ssize_t v) except -1:
    cdef Py_ssize_t i
    for i in range(k):
        if data[i] < 0 or data[i] >= v:
            raise IndexError(f"{name}[{i}] = {data[i]} is not a token id in [0, {v})")
    return 0


cdef class _Scratch:
    """A float64 tensor the module owns, with its address read once."""
    cdef object tensor
    cdef const double* data


cdef enum:
    SCRATCH_SIZES = 8         # distinct draw sizes whose scratch tensor a thread keeps
    SCRATCH_MAX_COUNT = 4096  # larger draws get a fresh tensor (drawing costs more than allocating)


cdef _Scratch _torch_scratch(Py_ssize_t count):
    """A float64 tensor of ``count`` elements, reused from call to call by this thread.

    Filling it with ``uniform_`` draws the same numbers as ``torch.rand(count, dtype=float64)`` and
    moves the generator the same way, without allocating a tensor per call.  Per thread, because
    torch releases the GIL while it draws and the kernel runs without it.  Bounded: a thread keeps
    at most SCRATCH_SIZES sizes (the oldest is dropped), each at most SCRATCH_MAX_COUNT elements,
    so at most 256 KiB of uniforms whatever sequence of K a caller uses.
    """
    cdef dict scratches = getattr(_per_thread, "scratches", None)
    cdef _Scratch scratch
    if scratches is None:
        scratches = _per_thread.scratches = {}
    scratch = scratches.get(count)
    if scratch is None:
        scratch = _Scratch()
        scratch.tensor = _torch_empty(count, dtype=_torch_float64)
        scratch.data = <const double*> <uintptr_t> scratch.tensor.data_ptr()
        if count <= SCRATCH_MAX_COUNT:
            if len(scratches) >= SCRATCH_SIZES:
                del scratches[next(iter(scratches))]  # the size cached first
            scratches[count] = scratch
    return scratch


def _scratch_sizes():
    """The draw sizes this thread's scratch cache holds (tests of its bound)."""
    return list(getattr(_per_thread, "scratches", {}))


cdef object _uniforms(object generator, object uniforms, Py_ssize_t count, const double** data,
                      _Held held):
    """The call's K + 1 uniforms as its own validated copy: drawn from the generator in one call,
    or given explicitly; copied into ``held`` before they are checked to lie in [0, 1)."""
    cdef const char* raw
    cdef Py_ssize_t n, i
    cdef double* u
    cdef _Scratch scratch
    if uniforms is None:
        if type(generator) is _numpy_generator:
            uniforms = generator.random(count)
        elif _torch_seen() and (generator is None or type(generator) is _torch_generator):
            scratch = _torch_scratch(count)
            try:
                scratch.tensor.uniform_(generator=generator)
            except RuntimeError:  # e.g. a CUDA generator: let _inputs name the problem
                uniforms = _inputs.draw_uniforms(generator, count)
            else:
                data[0] = <const double*> held.own_copy(scratch.data, count)
                return scratch.tensor
        else:
            uniforms = _inputs.draw_uniforms(generator, count)  # raises the right TypeError
    if not _read_vector(uniforms, b'f', 8, &raw, &n, held) or n != count:
        uniforms = _inputs.uniforms_float64(uniforms, count)
        if not _read_vector(uniforms, b'f', 8, &raw, &n, held):
            _unreadable("uniforms")
    u = <double*> held.own_copy(raw, count)
    for i in range(count):
        if not (0.0 <= u[i] < 1.0):  # also catches NaN
            raise ValueError("uniforms must lie in [0, 1)")
    data[0] = u
    return uniforms
