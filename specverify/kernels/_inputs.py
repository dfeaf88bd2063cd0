"""Validation and conversion of op arguments, for everything off the kernels' fast path.

``_args.pxi`` reads the common case directly (float32 rows with unit inner stride,
contiguous int64 tokens, float64 uniforms); anything else comes here, where every check raises
an exception whose message names the argument (and the row, where there is one), and what is
valid is converted into that common case.  Per-element checks (NaN, Inf, negative values, zero
mass) happen inside the kernels' single pass; ``raise_kernel_status`` words what they found.
torch is never imported here unless asked to draw from its default generator: a tensor can only
exist if the caller imported torch.
"""

import numbers
import sys

import numpy as np

FLOAT32_BYTES = 4


def loaded_torch():
    """The torch module if the caller has imported it, else None (never imports it)."""
    return sys.modules.get("torch")


def require_uniforms(uniforms, count):
    """The ``*_from_uniforms`` entries take their uniforms explicitly: None is a caller's mistake."""
    if uniforms is None:
        raise TypeError(f"uniforms must be the {count} float64 uniforms of the call, got None")


def is_tensor(x):
    torch = loaded_torch()
    return torch is not None and isinstance(x, torch.Tensor)


def _shape_text(shape):
    return "[" + ", ".join(str(int(s)) for s in shape) + "]"


def _misaligned_tensor(x):
    return x.numel() > 0 and x.data_ptr() % x.element_size() != 0


def plain_tensor(x, name):
    """x as a plain dense CPU ``torch.Tensor`` holding its values in memory: detached (no grad),
    no lazy negation, not a subclass (``nn.Parameter`` ...).  Wrong device or layout raises."""
    torch = loaded_torch()
    if x.device.type != "cpu":
        raise ValueError(f"{name} must be a CPU tensor, got device {x.device}")
    if x.layout != torch.strided:
        raise TypeError(f"{name} must be a dense tensor, got layout {x.layout} (use .to_dense())")
    if x.is_quantized:
        raise TypeError(f"{name} must hold plain numbers, got quantized dtype {x.dtype}")
    x = x.detach()
    if type(x) is not torch.Tensor:
        x = x.as_subclass(torch.Tensor)
    return x.resolve_neg()  # a lazily negated view: its memory does not hold its values


def plain_array(x, name, what):
    """x as an exact ``numpy.ndarray`` (subclasses such as ``np.memmap`` viewed as one; anything
    array-like converted).  Masked arrays are refused: the ops have no notion of a masked entry,
    and reading the data under the mask would be a silent guess."""
    if isinstance(x, np.ma.MaskedArray):
        raise TypeError(
            f"{name} is a numpy masked array: its masked entries have no value the op could use; "
            f"pass x.filled(value) (e.g. 0.0 for probabilities, -np.inf for greedy scores)")
    if type(x) is np.ndarray:
        return x
    try:
        return np.asarray(x)
    except (TypeError, ValueError, OverflowError) as error:
        raise TypeError(f"{name} must be {what}: {error}") from None


def _owned_aligned(x, dtype):
    """x as dtype, C-contiguous and aligned (a copy unless it already is)."""
    x = np.asarray(x, dtype=dtype)
    if not (x.flags.c_contiguous and x.flags.aligned):
        x = np.array(x, dtype=dtype, order="C", copy=True)
    return x


def float_rows(x, name, *, rows=None, cols=None):
    """Validate a 2-D float matrix; return it as float32 rows with unit inner stride, aligned.

    float32 is used as is (no copy unless the inner stride is not 1 or the memory is not 4-byte
    aligned); float64, float16 and bfloat16 are converted to float32 (a copy); integer, boolean,
    complex and date/time dtypes raise TypeError.  rows/cols, when given, are the required shape.
    The result is an exact ``np.ndarray`` or ``torch.Tensor``.
    """
    if is_tensor(x):
        torch = loaded_torch()
        x = plain_tensor(x, name)
        if x.is_complex() or not x.is_floating_point():
            raise TypeError(f"{name} must hold floating-point scores (float32 preferred), got {x.dtype}")
        if x.dim() != 2:
            raise ValueError(f"{name} must be 2-D [rows, V], got shape {_shape_text(x.shape)}")
        if x.dtype != torch.float32:
            x = x.to(torch.float32)
        if (x.shape[0] > 0 and x.shape[1] > 1 and x.stride(1) != 1) or _misaligned_tensor(x):
            x = x.clone(memory_format=torch.contiguous_format)
        shape = x.shape
    else:
        x = plain_array(x, name, "a 2-D float array or tensor")
        kind = x.dtype.kind
        if kind != "f":
            raise TypeError(f"{name} must hold floating-point scores (float32 preferred), got dtype {x.dtype}")
        if x.ndim != 2:
            raise ValueError(f"{name} must be 2-D [rows, V], got shape {_shape_text(x.shape)}")
        if x.dtype != np.float32:
            x = x.astype(np.float32)
        if ((x.shape[1] > 1 and x.strides[1] != FLOAT32_BYTES) or x.strides[0] % FLOAT32_BYTES
                or not x.flags.aligned):
            x = np.array(x, order="C", copy=True)
        shape = x.shape
    n_rows, n_cols = int(shape[0]), int(shape[1])
    if n_cols == 0:
        raise ValueError(f"{name} has an empty vocabulary (shape {_shape_text(shape)})")
    if rows is not None and n_rows != rows:
        raise ValueError(f"{name} must have {rows} rows, got shape {_shape_text(shape)}")
    if cols is not None and n_cols != cols:
        raise ValueError(f"{name} must have V = {cols} columns like target_probs, got shape {_shape_text(shape)}")
    return x


def warp_arrays(logits, out):
    """``warp``'s arguments off the fast path: ``(rows, target, result)``, where ``rows`` are the
    validated logits as C-contiguous float32 ``[n, V]`` (a view of a CPU tensor's memory where
    possible, else a converted copy), ``target`` the writable C-contiguous float32 ``[n, V]``
    ndarray the kernel writes (out's memory, or a new array) and ``result`` what ``warp``
    returns: ``out``, else a new array of the logits' shape (a tensor if logits is one)."""
    torch = loaded_torch()
    if not (is_tensor(logits) or isinstance(logits, np.ndarray)):
        logits = np.asarray(logits)
    one_row = logits.ndim == 1
    x = float_rows(logits[None, :] if one_row else logits, "logits")
    rows = np.ascontiguousarray(x.numpy() if is_tensor(x) else x)
    if out is None:
        if is_tensor(x):
            result = torch.empty(rows.shape, dtype=torch.float32)
            target = result.numpy()
        else:
            result = target = np.empty(rows.shape, dtype=np.float32)
        return rows, target, result[0] if one_row else result
    out_rows = out[None, :] if one_row and getattr(out, "ndim", 0) == 1 else out
    return rows, _writable_rows(out_rows, rows.shape), out


def _float32_operand(x, name, ndims, what):
    """A float32 operand of ``linear`` as a C-contiguous ndarray (a view of a CPU tensor's or an
    array's memory where possible, else a converted copy); other float dtypes are converted."""
    x = plain_tensor(x, name).numpy() if is_tensor(x) else plain_array(x, name, what)
    if x.dtype.kind != "f":
        raise TypeError(f"{name} must hold floating-point numbers (float32 preferred), got dtype {x.dtype}")
    if x.ndim not in ndims:
        raise ValueError(f"{name} must be {what}, got shape {_shape_text(x.shape)}")
    return np.ascontiguousarray(x, dtype=np.float32)


def linear_arrays(x, weight, bias, out):
    """``linear``'s arguments off the fast path: ``(rows, weight, bias, target, result)``, with
    ``rows`` the validated x as C-contiguous float32 ``[n, in]``, ``weight`` ``[out, in]`` and
    ``bias`` ``[out]`` (or None) likewise, ``target`` the writable C-contiguous float32
    ``[n, out]`` ndarray the kernel writes (out's memory, or a new array) and ``result`` what
    ``linear`` returns: ``out``, else a new array of x's kind (a tensor if x is one)."""
    torch = loaded_torch()
    x_is_tensor = is_tensor(x)
    rows = _float32_operand(x, "x", (1, 2), "a [n, in] or [in] float array or tensor")
    one_row = rows.ndim == 1
    rows = rows[None, :] if one_row else rows
    weight = _float32_operand(weight, "weight", (2,), "a 2-D [out, in] float array or tensor")
    if weight.shape[1] != rows.shape[1]:
        raise ValueError(f"weight must have in = {rows.shape[1]} columns like x, got shape {_shape_text(weight.shape)}")
    if bias is not None:
        bias = _float32_operand(bias, "bias", (1,), "a 1-D [out] float array or tensor")
        if bias.shape[0] != weight.shape[0]:
            raise ValueError(f"bias must have out = {weight.shape[0]} entries like weight, got shape {_shape_text(bias.shape)}")
    shape = (rows.shape[0], weight.shape[0])
    if out is None:
        if x_is_tensor:
            result = torch.empty(shape, dtype=torch.float32)
            target = result.numpy()
        else:
            result = target = np.empty(shape, dtype=np.float32)
        return rows, weight, bias, target, result[0] if one_row else result
    out_rows = out[None, :] if one_row and getattr(out, "ndim", 0) == 1 else out
    return rows, weight, bias, _writable_rows(out_rows, shape), out


def _writable_rows(out, shape):
    """out as a writable C-contiguous float32 ndarray of ``shape`` (a view, never a copy)."""
    if is_tensor(out):
        torch = loaded_torch()
        if out.device.type != "cpu" or out.dtype != torch.float32:
            raise TypeError(f"out must be a CPU float32 tensor, got {out.dtype} on {out.device}")
        if out.layout != torch.strided:
            raise TypeError(f"out must be a dense tensor, got layout {out.layout}")
        if out.requires_grad:
            raise ValueError("out must not require grad")
        if out.is_neg():  # its memory holds the negation of what it reads as
            raise ValueError("out must not be a negated view (torch._neg_view): pass out.resolve_neg()")
        out = out.numpy()
    if not isinstance(out, np.ndarray) or out.dtype != np.float32:
        raise TypeError(f"out must be a float32 ndarray or tensor, got {type(out).__name__}")
    if tuple(out.shape) != tuple(shape):
        raise ValueError(f"out must have shape {list(shape)}, got {list(out.shape)}")
    if not out.flags.c_contiguous or not out.flags.writeable or not out.flags.aligned:
        raise ValueError("out must be C-contiguous, aligned and writable")
    return out.view(np.ndarray)  # a subclass (np.memmap, ...) as a plain view of the same memory


INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1


def tokens_int64(tokens, name="draft_tokens"):
    """Validate a 1-D sequence of integer token ids; return them as contiguous, aligned int64
    (an exact ``np.ndarray`` or ``torch.Tensor``).

    The range against the vocabulary is checked by the kernel module, on its own copy.
    """
    if is_tensor(tokens):
        torch = loaded_torch()
        tokens = plain_tensor(tokens, name)
        if tokens.dim() == 1 and tokens.numel() == 0:
            return np.zeros(0, dtype=np.int64)  # no tokens, whatever the dtype (torch.tensor([]) is float)
        if tokens.dtype == torch.bool or tokens.is_floating_point() or tokens.is_complex():
            raise TypeError(f"{name} must hold integer token ids, got {tokens.dtype}")
        if tokens.dim() != 1:
            raise ValueError(f"{name} must be 1-D [K], got shape {_shape_text(tokens.shape)}")
        if tokens.dtype != torch.int64:
            tokens = tokens.to(torch.int64)
        if not tokens.is_contiguous() or _misaligned_tensor(tokens):
            tokens = tokens.clone(memory_format=torch.contiguous_format)
        return tokens
    tokens = plain_array(tokens, name, "a 1-D sequence of integer token ids")
    if tokens.ndim != 1:
        raise ValueError(f"{name} must be 1-D [K], got shape {_shape_text(tokens.shape)}")
    if tokens.size == 0:
        return np.zeros(0, dtype=np.int64)  # no tokens, whatever the dtype (np.asarray([]) is float)
    kind = tokens.dtype.kind
    if kind == "O":
        # Python ints (small, or too large for int64) and other objects end up here.
        for i, t in enumerate(tokens):
            if not isinstance(t, (int, np.integer)) or isinstance(t, (bool, np.bool_)):
                raise TypeError(f"{name} must hold integer token ids, got {type(t).__name__} at {name}[{i}]")
            if not INT64_MIN <= int(t) <= INT64_MAX:
                raise IndexError(f"{name}[{i}] = {int(t)} is outside the int64 range (not a token id)")
        return np.array([int(t) for t in tokens], dtype=np.int64)
    if kind == "u" and int(tokens.max()) > INT64_MAX:
        i = int(np.argmax(tokens > INT64_MAX))
        raise IndexError(f"{name}[{i}] = {int(tokens[i])} is outside the int64 range (not a token id)")
    if kind not in "iu":
        raise TypeError(f"{name} must hold integer token ids, got dtype {tokens.dtype}")
    return _owned_aligned(tokens, np.int64)


def uniforms_float64(uniforms, count, name="uniforms", what="K + 1"):
    """Validate explicit uniforms: ``count`` float64 values (``what`` says how many), each in
    [0, 1); returned as a contiguous, aligned float64 ndarray."""
    if is_tensor(uniforms):
        uniforms = plain_tensor(uniforms, name)
        if uniforms.is_complex() or not uniforms.is_floating_point():
            raise TypeError(f"{name} must be floating point (float64), got {uniforms.dtype}")
        uniforms = uniforms.to(loaded_torch().float64).numpy()
    u = plain_array(uniforms, name, "a 1-D float64 array")
    if u.dtype.kind != "f":
        raise TypeError(f"{name} must be floating point (float64), got dtype {u.dtype}")
    if u.shape != (count,):
        raise ValueError(f"{name} must have shape [{count}] ({what}), got {_shape_text(u.shape)}")
    u = _owned_aligned(u, np.float64)
    if not (np.all(u >= 0.0) and np.all(u < 1.0)):  # also rejects NaN
        raise ValueError(f"{name} must lie in [0, 1)")
    return u


def batch_methods(method, n_requests, codes):
    """Per-request method codes ``[R]`` (uint8) from a sequence of names or an integer array.

    codes: ``{name: code}``; valid integer codes are ``0 .. len(codes) - 1``.
    """
    names = {code: name for name, code in codes.items()}
    if is_tensor(method):
        method = method.detach().cpu().numpy()
    if isinstance(method, np.ndarray) and method.dtype.kind in "iu":
        if method.shape != (n_requests,):
            raise ValueError(f"method must have one entry per request (R = {n_requests}), got shape {_shape_text(method.shape)}")
        bad = np.flatnonzero((method < 0) | (method >= len(codes)))
        if bad.size:
            r = int(bad[0])
            raise ValueError(f"method[{r}] = {int(method[r])} is not a method code {names}")
        return method.astype(np.uint8)
    try:
        method = list(method)
    except TypeError:
        raise TypeError(f"method must be a name, a sequence of names or an integer array, got {type(method).__name__}") from None
    if len(method) != n_requests:
        raise ValueError(f"method must have one entry per request (R = {n_requests}), got {len(method)}")
    found = np.array([codes.get(name, -1) if type(name) is str else -1 for name in method], dtype=np.int16)
    bad = np.flatnonzero(found < 0)
    if bad.size:
        r = int(bad[0])
        raise ValueError(f"method[{r}] = {method[r]!r} is not one of {tuple(codes)}")
    return found.astype(np.uint8)


def batch_mask(mask, n_requests, name):
    """A per-request boolean mask ``[R]`` as uint8 (bool arrays, tensors or sequences of bools)."""
    if is_tensor(mask):
        mask = mask.detach().cpu().numpy()
    mask = np.asarray(mask)
    if mask.dtype.kind != "b":
        raise TypeError(f"{name} must hold booleans, got dtype {mask.dtype}")
    if mask.shape != (n_requests,):
        raise ValueError(f"{name} must have one entry per request (R = {n_requests}), got shape {_shape_text(mask.shape)}")
    return mask.astype(np.uint8)


def thread_count(num_threads):
    """``num_threads`` as an int >= 1 (any integral type but bool), else a ``ValueError``."""
    if isinstance(num_threads, bool) or not isinstance(num_threads, numbers.Integral) or num_threads < 1:
        raise ValueError(f"num_threads must be a positive integer, got {num_threads!r}")
    return int(num_threads)


def whole_number(value, name, minimum=0):
    """``value`` as an int ``>= minimum``: any integral type but bool (floats, even 4.0, inf or NaN,
    None and strings are refused rather than cast), else a TypeError/ValueError naming ``name``."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be an integer >= {minimum}, got {value!r} ({type(value).__name__})")
    if value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")
    return int(value)


def flag(value, name):
    """``value`` as a bool: only ``True``/``False`` (or NumPy's), never a string or a number."""
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name} must be True or False, got {value!r} ({type(value).__name__})")
    return bool(value)


def token_ids(ids, name):
    """One token id or a sequence of them (the ``generation_config.eos_token_id`` forms: an int, a
    list, a tuple, a 0-d or 1-D array or tensor) as a tuple of non-negative Python ints; ``None`` is
    the empty tuple. Booleans, floats and strings are refused, as in :func:`tokens_int64`."""
    if ids is None:
        return ()
    if isinstance(ids, (bool, np.bool_)) or isinstance(ids, (str, bytes)):
        raise TypeError(f"{name} must be an integer token id or a sequence of them, got {ids!r}")
    if isinstance(ids, numbers.Integral):
        ids = [ids]
    elif is_tensor(ids) or isinstance(ids, np.ndarray):
        ids = ids.reshape(-1) if ids.ndim == 0 else ids
    elif isinstance(ids, (set, frozenset)):
        ids = sorted(ids, key=repr)
    elif not isinstance(ids, (list, tuple)):
        raise TypeError(f"{name} must be an integer token id or a sequence of them, got {type(ids).__name__}")
    values = [int(t) for t in np.asarray(tokens_int64(ids, name)).tolist()]
    negative = [t for t in values if t < 0]
    if negative:
        raise ValueError(f"{name} holds {negative[0]}: token ids are >= 0")
    return tuple(values)


def draw_uniforms(generator, count):
    """``count`` float64 uniforms in [0, 1), drawn in one call from the caller's generator.

    torch.Generator (or None: torch's default generator) -> ``torch.rand(count, dtype=float64)``;
    numpy.random.Generator -> ``generator.random(count)``.
    """
    if isinstance(generator, np.random.Generator):
        return generator.random(count)
    torch = loaded_torch()
    if generator is None:
        if torch is None:
            try:
                import torch
            except ImportError:
                raise TypeError(
                    "generator=None means torch's default generator, but torch is not installed; "
                    "pass a numpy.random.Generator"
                ) from None
        return torch.rand(count, dtype=torch.float64).numpy()
    if torch is not None and isinstance(generator, torch.Generator):
        if generator.device.type != "cpu":
            raise ValueError(f"generator must be a CPU generator, got device {generator.device}")
        return torch.rand(count, dtype=torch.float64, generator=generator).numpy()
    raise TypeError(
        f"generator must be a torch.Generator, a numpy.random.Generator or None, got {type(generator).__name__}"
    )


def row_copy(rows, i):
    """A private float32 copy of row i of validated rows (ndarray or tensor), for error messages:
    every check of a message reads this one copy, never the caller's memory again."""
    row = rows[i]
    if is_tensor(row):
        row = row.detach().resolve_neg().numpy()
    return np.array(row, dtype=np.float32, copy=True)


def describe_bad_values(row, name, i, allow_negative=False):
    """Message for a row the kernel flagged: names the first NaN, Inf or negative value of
    ``row``, a copy taken after the kernel ran."""
    nan = np.flatnonzero(np.isnan(row))
    if nan.size:
        return f"{name}[{i}] contains NaN (first at column {int(nan[0])})"
    infinite = np.flatnonzero(np.isposinf(row) if allow_negative else ~np.isfinite(row))
    if infinite.size:
        j = int(infinite[0])
        return f"{name}[{i}] contains {float(row[j])} (first at column {j})"
    if not allow_negative:
        negative = np.flatnonzero(row < 0)
        if negative.size:
            j = int(negative[0])
            return f"{name}[{i}] contains a negative value {float(row[j])} at column {j}"
    return (f"{name}[{i}] held an invalid value (NaN, Inf{'' if allow_negative else ' or negative'}) "
            f"when the kernel read it, but not when copied for this message: is another thread "
            f"writing to it?")


def raise_kernel_status(status, row, target, draft):
    """Turn a kernel's status into the exception that names the argument and row.

    status: the kernel's status name; target/draft: the validated float32 rows it read.
    """
    if status == "bad_target_values":
        raise ValueError(describe_bad_values(row_copy(target, row), "target_probs", row))
    if status == "bad_draft_values":
        raise ValueError(describe_bad_values(row_copy(draft, row), "draft_probs", row))
    if status == "zero_target_mass":
        raise ValueError(f"target_probs[{row}] has zero mass (all entries are 0)")
    if status == "zero_draft_mass":
        raise ValueError(f"draft_probs[{row}] has zero mass (all entries are 0)")
    if status == "bad_scores":
        raise ValueError(describe_bad_values(row_copy(target, row), "target_probs", row, allow_negative=True))
    if status == "no_finite_score":
        raise ValueError(f"target_probs[{row}] is -inf everywhere: it has no argmax")
    if status == "no_memory":
        raise MemoryError("specverify: could not allocate the kernel's scratch buffer")
    raise RuntimeError(f"specverify kernel returned unknown status {status}")
