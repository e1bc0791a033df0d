"""GGUF version 3, the file format llama.cpp loads: a streaming writer, a
reader of the header and tensor table, and the tensor encodings the
harness uses (F32, BF16, Q8_0, Q4_0).

Layout: "GGUF", version (u32), tensor count (u64), key-value count (u64);
the key-values (a string key, a u32 value type, the value); one entry per
tensor (name, dimension count u32, the dimensions u64 innermost first, the
ggml type u32, the offset u64 from the start of the data section); padding
to general.alignment (32); the tensor data, each tensor at its offset and
padded to the alignment.  Little-endian throughout; strings are a u64 byte
count and UTF-8 bytes without a terminator."""
import mmap
import struct

import numpy as np

MAGIC = b"GGUF"
VERSION = 3
ALIGNMENT = 32

# ggml tensor types used here
F32, F16, Q4_0, Q8_0, BF16 = 0, 1, 2, 8, 30
TYPE_NAMES = {F32: "F32", F16: "F16", Q4_0: "Q4_0", Q8_0: "Q8_0", BF16: "BF16"}
# general.file_type ("mostly" this type; 1-D tensors stay F32)
FILE_TYPE = {F32: 0, F16: 1, Q4_0: 2, Q8_0: 7, BF16: 32}

# value types of the key-values
(UINT8, INT8, UINT16, INT16, UINT32, INT32, FLOAT32, BOOL, STRING, ARRAY,
 UINT64, INT64, FLOAT64) = range(13)
_SCALAR = {UINT8: "<B", INT8: "<b", UINT16: "<H", INT16: "<h", UINT32: "<I", INT32: "<i",
           FLOAT32: "<f", BOOL: "<?", UINT64: "<Q", INT64: "<q", FLOAT64: "<d"}

# Q8_0: blocks of 32 values, one f16 scale then 32 int8
QK8_0 = 32
Q8_0_BLOCK_BYTES = 2 + QK8_0
# Q4_0: blocks of 32 values, one f16 scale then 16 bytes of two nibbles each
QK4_0 = 32
Q4_0_BLOCK_BYTES = 2 + QK4_0 // 2


def _pad(n, align=ALIGNMENT):
    return (n + align - 1) // align * align


def _string(s):
    b = s.encode("utf-8") if isinstance(s, str) else bytes(s)
    return struct.pack("<Q", len(b)) + b


def _value(vtype, v):
    if vtype == STRING:
        return _string(v)
    if vtype == ARRAY:
        etype, items = v
        out = [struct.pack("<IQ", etype, len(items))]
        if etype == STRING:
            out += [_string(s) for s in items]
        else:
            out.append(np.asarray(items, dtype=np.dtype(_SCALAR[etype])).tobytes())
        return b"".join(out)
    return struct.pack(_SCALAR[vtype], v)


# ---- encodings -------------------------------------------------------------

def bf16_bits(x):
    """f32 -> bf16 bit patterns (uint16), rounding to nearest even; a NaN
    stays a (quiet) NaN."""
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    nan = (u & 0x7FFFFFFF) > 0x7F800000
    r = ((u.astype(np.uint64) + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
    return np.where(nan, ((u >> 16) | 0x40).astype(np.uint16), r)


def bf16_to_f32(bits):
    return (np.asarray(bits, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32)


def _roundf(x):
    """C's roundf: halves away from zero (numpy's round goes to even).  The
    fraction is doubled rather than 0.5 added, which would round up values
    just below a half (0.49999997 + 0.5 is 1.0 in f32)."""
    a = np.abs(x)
    whole = np.floor(a)
    return np.sign(x) * (whole + np.floor(2 * (a - whole)))


def quantize_q8_0(x):
    """Rows of f32 (the last dimension a multiple of 32) -> Q8_0 bytes, as
    ggml's reference quantizer: per block d = max|x| / 127, q = roundf(x / d)
    (computed as x times the f32 reciprocal of d, as ggml does), d stored as
    f16.  Returns uint8 [rows, cols / 32 * 34]."""
    x = np.asarray(x, dtype=np.float32)
    if x.shape[-1] % QK8_0:
        raise ValueError(f"Q8_0 needs rows of a multiple of {QK8_0} values, not {x.shape[-1]}")
    blocks = x.reshape(-1, QK8_0)
    d = (np.abs(blocks).max(axis=1, keepdims=True) / np.float32(127)).astype(np.float32)
    with np.errstate(divide="ignore"):
        inv = np.where(d == 0, np.float32(0), np.float32(1) / d).astype(np.float32)
    q = _roundf(blocks * inv).astype(np.int8)
    out = np.concatenate([d.astype(np.float16).view(np.uint8), q.view(np.uint8)], axis=1)
    return out.reshape(x.shape[:-1] + (x.shape[-1] // QK8_0 * Q8_0_BLOCK_BYTES,))


def dequantize_q8_0(raw, cols):
    """Q8_0 bytes -> f32 rows of cols values."""
    b = np.asarray(raw, dtype=np.uint8).reshape(-1, Q8_0_BLOCK_BYTES)
    d = b[:, :2].copy().view(np.float16).astype(np.float32)
    q = b[:, 2:].view(np.int8).astype(np.float32)
    return (q * d).reshape(-1, cols)


def quantize_q4_0(x):
    """Rows of f32 (the last dimension a multiple of 32) -> Q4_0 bytes, as
    ggml's reference quantizer (quantize_row_q4_0_ref): per block m = the
    value of largest magnitude (the first of equals), d = m / -8, nibble =
    min(15, floor(x * (1/d) + 8.5)) in f32, d stored as f16; byte j holds
    value j in its low nibble and value j + 16 in its high one.  Returns
    uint8 [rows, cols / 32 * 18]."""
    x = np.asarray(x, dtype=np.float32)
    if x.shape[-1] % QK4_0:
        raise ValueError(f"Q4_0 needs rows of a multiple of {QK4_0} values, not {x.shape[-1]}")
    blocks = x.reshape(-1, QK4_0)
    first = np.abs(blocks).argmax(axis=1)   # argmax keeps the first of equals
    m = blocks[np.arange(len(blocks)), first]
    m = np.where(m == 0, np.float32(0), m)   # ggml's m starts at +0: an all-zero block's d is -0
    d = (m / np.float32(-8)).astype(np.float32)[:, None]
    with np.errstate(divide="ignore"):
        inv = np.where(d == 0, np.float32(0), np.float32(1) / d).astype(np.float32)
    v = (blocks * inv).astype(np.float32) + np.float32(8.5)
    q = np.minimum(15, np.floor(v)).astype(np.uint8)
    packed = q[:, :QK4_0 // 2] | (q[:, QK4_0 // 2:] << 4)
    out = np.concatenate([d.astype(np.float16).view(np.uint8), packed], axis=1)
    return out.reshape(x.shape[:-1] + (x.shape[-1] // QK4_0 * Q4_0_BLOCK_BYTES,))


def dequantize_q4_0(raw, cols):
    """Q4_0 bytes -> f32 rows of cols values: (nibble - 8) * d."""
    b = np.asarray(raw, dtype=np.uint8).reshape(-1, Q4_0_BLOCK_BYTES)
    d = b[:, :2].copy().view(np.float16).astype(np.float32)
    qs = b[:, 2:]
    q = np.concatenate([qs & 0x0F, qs >> 4], axis=1).astype(np.float32) - 8
    return (q * d).reshape(-1, cols)


def nbytes(gtype, dims):
    """Bytes of a tensor of ggml type gtype with dimensions dims (innermost first)."""
    n = int(np.prod(dims, dtype=np.int64))
    if gtype == F32:
        return 4 * n
    if gtype in (F16, BF16):
        return 2 * n
    if gtype == Q8_0:
        return n // QK8_0 * Q8_0_BLOCK_BYTES
    if gtype == Q4_0:
        return n // QK4_0 * Q4_0_BLOCK_BYTES
    raise ValueError(f"ggml type {gtype} is not handled here")


# ---- writing ---------------------------------------------------------------

class Writer:
    """Collects key-values and tensor descriptions, then writes the file in
    one pass: each tensor's data comes from its producer, a function called
    once while writing that yields the bytes in order as arrays, so that no
    more than a part of one tensor is in memory at a time."""

    def __init__(self):
        self.kv = []          # (key, value type, value)
        self.tensors = []     # (name, ggml type, dims innermost first, producer)

    def add(self, key, vtype, value):
        self.kv.append((key, vtype, value))

    def add_array(self, key, etype, items):
        self.kv.append((key, ARRAY, (etype, list(items))))

    def add_tensor(self, name, gtype, shape, produce):
        """shape in numpy order (outermost first), as the producer's array is."""
        self.tensors.append((name, gtype, tuple(int(d) for d in reversed(shape)), produce))

    def write(self, path):
        head = [MAGIC, struct.pack("<IQQ", VERSION, len(self.tensors), len(self.kv))]
        head += [_string(k) + struct.pack("<I", t) + _value(t, v) for k, t, v in self.kv]
        offset = 0
        for name, gtype, dims, _ in self.tensors:
            head.append(_string(name) + struct.pack("<I", len(dims)) + struct.pack(f"<{len(dims)}Q", *dims) +
                        struct.pack("<IQ", gtype, offset))
            offset += _pad(nbytes(gtype, dims))
        with open(path, "wb") as f:
            h = b"".join(head)
            f.write(h + b"\0" * (_pad(len(h)) - len(h)))
            for name, gtype, dims, produce in self.tensors:
                n = 0
                for chunk in produce():
                    data = memoryview(np.ascontiguousarray(chunk)).cast("B")
                    f.write(data)
                    n += len(data)
                if n != nbytes(gtype, dims):
                    raise ValueError(f"{name}: {n} bytes, expected {nbytes(gtype, dims)}")
                f.write(b"\0" * (_pad(n) - n))


# ---- reading ---------------------------------------------------------------

class _Cursor:
    def __init__(self, buf):
        self.buf, self.pos = buf, 0

    def take(self, fmt):
        v = struct.unpack_from(fmt, self.buf, self.pos)
        self.pos += struct.calcsize(fmt)
        return v[0] if len(v) == 1 else v

    def string(self):
        n = self.take("<Q")
        if self.pos + n > len(self.buf):
            raise ValueError("string runs past the end of the file")
        s = bytes(self.buf[self.pos:self.pos + n]).decode("utf-8")
        self.pos += n
        return s

    def value(self, vtype):
        if vtype == STRING:
            return self.string()
        if vtype == ARRAY:
            etype, n = self.take("<IQ")
            if etype == STRING:
                return [self.string() for _ in range(n)]
            dt = np.dtype(_SCALAR[etype])
            a = np.frombuffer(self.buf, dtype=dt, count=n, offset=self.pos)
            self.pos += n * dt.itemsize
            return a.tolist()
        if vtype not in _SCALAR:
            raise ValueError(f"unknown value type {vtype}")
        return self.take(_SCALAR[vtype])


class Reader:
    """A GGUF file, mapped: .version, .kv {key: value}, .kv_types {key: value
    type}, .tensors {name: (ggml type, dims innermost first, absolute offset)}
    in file order; .raw(name) the tensor's bytes, .array(name) its values as
    f32 in numpy order (outermost first)."""

    def __init__(self, path):
        self._f = open(path, "rb")
        self.buf = mmap.mmap(self._f.fileno(), 0, access=mmap.ACCESS_READ)
        c = _Cursor(self.buf)
        if bytes(self.buf[:4]) != MAGIC:
            raise ValueError(f"{path}: not a GGUF file")
        c.pos = 4
        self.version, n_tensors, n_kv = c.take("<IQQ")
        self.kv, self.kv_types = {}, {}
        for _ in range(n_kv):
            key = c.string()
            vtype = c.take("<I")
            self.kv[key] = c.value(vtype)
            self.kv_types[key] = vtype
        align = self.kv.get("general.alignment", ALIGNMENT)
        entries = []
        for _ in range(n_tensors):
            name = c.string()
            nd = c.take("<I")
            dims = tuple(c.take(f"<{nd}Q")) if nd > 1 else (c.take("<Q"),)
            gtype, off = c.take("<IQ")
            entries.append((name, gtype, dims, off))
        self.data_start = _pad(c.pos, align)
        self.tensors = {n: (t, d, self.data_start + o) for n, t, d, o in entries}

    def raw(self, name):
        gtype, dims, off = self.tensors[name]
        n = nbytes(gtype, dims)
        if off + n > len(self.buf):
            raise ValueError(f"{name}: data runs past the end of the file")
        return np.frombuffer(self.buf, dtype=np.uint8, count=n, offset=off)

    def array(self, name):
        gtype, dims, _ = self.tensors[name]
        raw, shape = self.raw(name), tuple(reversed(dims))
        if gtype == F32:
            return raw.view(np.float32).reshape(shape)
        if gtype == F16:
            return raw.view(np.float16).astype(np.float32).reshape(shape)
        if gtype == BF16:
            return bf16_to_f32(raw.view(np.uint16)).reshape(shape)
        if gtype == Q8_0:
            return dequantize_q8_0(raw, dims[0]).reshape(shape)
        if gtype == Q4_0:
            return dequantize_q4_0(raw, dims[0]).reshape(shape)
        raise ValueError(f"{name}: ggml type {gtype} is not handled here")

    def close(self):
        try:
            self.buf.close()
        except BufferError:
            pass   # arrays handed out still view the map; it goes with them
        self._f.close()
