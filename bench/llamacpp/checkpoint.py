"""The input side of the GGUF converter: a Hugging Face checkpoint's
config.json and safetensors files, read with every check that a damaged
or unexpected input needs, so that the converter stops before it writes
anything and says which file, tensor or key is wrong.

A safetensors file is an 8-byte little-endian header length, that many
bytes of JSON ({name: {dtype, shape, data_offsets [begin, end)}}, plus an
optional "__metadata__"), then the data; offsets count from the end of the
header.  Checked here: the header fits in the file and is a JSON object,
each entry has a known dtype, a shape of non-negative integers, offsets
whose span is exactly the shape's bytes and that end inside the file."""
import json
import os
import struct

import numpy as np

import gguf


class ConvertError(Exception):
    """A refusal of the converter: the message names what is wrong."""


# safetensors dtype -> (numpy dtype of the stored values, bytes per value)
DTYPES = {"F32": (np.float32, 4), "BF16": (np.uint16, 2), "F16": (np.float16, 2)}


class Config:
    """config.json, with lookups that name the file and the key when the key
    is missing or not of the expected kind."""

    def __init__(self, model_dir):
        self.path = os.path.join(model_dir, "config.json")
        try:
            with open(self.path, encoding="utf-8") as f:
                self.d = json.load(f)
        except OSError as e:
            raise ConvertError(f"{self.path}: {e.strerror}") from None
        except ValueError as e:
            raise ConvertError(f"{self.path}: not JSON ({e})") from None
        if not isinstance(self.d, dict):
            raise ConvertError(f"{self.path}: not a JSON object")

    def get(self, key, default=None):
        v = self.d.get(key)
        return default if v is None else v

    def __contains__(self, key):
        return self.d.get(key) is not None

    def int(self, key, default=None, minimum=1):
        """An integer key (at least minimum); default when absent, or an
        error naming the key when absent and no default is given."""
        v = self.d.get(key)
        if v is None:
            if default is None:
                raise ConvertError(f"{self.path}: the key {key!r} is missing")
            return default
        if isinstance(v, bool) or not isinstance(v, int) or v < minimum:
            raise ConvertError(f"{self.path}: {key} = {v!r}, expected an integer >= {minimum}")
        return v

    def float(self, key, default=None):
        v = self.d.get(key)
        if v is None:
            if default is None:
                raise ConvertError(f"{self.path}: the key {key!r} is missing")
            return float(default)
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise ConvertError(f"{self.path}: {key} = {v!r}, expected a number")
        return float(v)

    def head_dim(self):
        hd = self.d.get("head_dim")
        return self.int("head_dim") if hd is not None else self.int("hidden_size") // self.int("num_attention_heads")


def _header(path):
    """(header dict, data start, file size) of one safetensors file."""
    try:
        size = os.path.getsize(path)
        with open(path, "rb") as f:
            first = f.read(8)
            if len(first) < 8:
                raise ConvertError(f"{path}: truncated ({size} bytes, shorter than the 8-byte header length)")
            (n,) = struct.unpack("<Q", first)
            if n > size - 8:
                raise ConvertError(f"{path}: truncated (a header of {n} bytes in a file of {size})")
            text = f.read(n)
    except OSError as e:
        raise ConvertError(f"{path}: {e.strerror}") from None
    try:
        header = json.loads(text)
    except ValueError as e:
        raise ConvertError(f"{path}: the header is not JSON ({e})") from None
    if not isinstance(header, dict):
        raise ConvertError(f"{path}: the header is not a JSON object")
    return header, 8 + n, size


def _check_entry(path, name, e, data_start, size):
    if not isinstance(e, dict):
        raise ConvertError(f"{path}: tensor {name}: the entry is not an object")
    dt, shape, offs = e.get("dtype"), e.get("shape"), e.get("data_offsets")
    if dt not in DTYPES:
        raise ConvertError(f"{path}: tensor {name}: dtype {dt!r} is not handled ({', '.join(DTYPES)} are)")
    if not isinstance(shape, list) or not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0
                                              for d in shape):
        raise ConvertError(f"{path}: tensor {name}: shape {shape!r} is not a list of sizes")
    if (not isinstance(offs, list) or len(offs) != 2 or not all(isinstance(o, int) for o in offs)
            or not 0 <= offs[0] <= offs[1]):
        raise ConvertError(f"{path}: tensor {name}: data_offsets {offs!r} are not [begin, end]")
    want = int(np.prod(shape, dtype=np.int64)) * DTYPES[dt][1]
    if offs[1] - offs[0] != want:
        raise ConvertError(f"{path}: tensor {name}: {offs[1] - offs[0]} bytes of data for shape {shape} {dt} "
                           f"({want} expected)")
    if data_start + offs[1] > size:
        raise ConvertError(f"{path}: truncated: tensor {name} ends at byte {data_start + offs[1]} of a "
                           f"{size}-byte file")


class Safetensors:
    """The tensors of model.safetensors or of the shards its index names,
    checked when opened, mapped, and read as f32 (or their raw bf16 bits)
    one tensor at a time."""

    def __init__(self, model_dir):
        index = os.path.join(model_dir, "model.safetensors.index.json")
        if os.path.exists(index):
            try:
                with open(index, encoding="utf-8") as f:
                    files = sorted(set(json.load(f)["weight_map"].values()))
            except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
                raise ConvertError(f"{index}: no weight_map of file names ({e})") from None
        else:
            files = ["model.safetensors"]
        self.where = {}
        for fn in files:
            path = os.path.join(model_dir, fn)
            header, base, size = _header(path)
            for name, e in header.items():
                if name == "__metadata__":
                    continue
                _check_entry(path, name, e, base, size)
                if name in self.where:
                    raise ConvertError(f"{path}: tensor {name} is also in {self.where[name][0]}")
                self.where[name] = (path, base, e)

    def __contains__(self, name):
        return name in self.where

    def shape(self, name):
        return tuple(self.where[name][2]["shape"])

    def dtype(self, name):
        return self.where[name][2]["dtype"]

    def _raw(self, name, np_dtype):
        path, base, e = self.where[name]
        start, end = e["data_offsets"]
        count = (end - start) // np.dtype(np_dtype).itemsize
        if count == 0:
            return np.zeros(e["shape"], dtype=np_dtype)
        return np.memmap(path, dtype=np_dtype, mode="r", offset=base + start, shape=(count,)).reshape(e["shape"])

    def f32_source(self, name):
        """(the stored array, a function turning a slice of it into f32)."""
        dt = self.dtype(name)
        if dt == "F32":
            return self._raw(name, np.float32), lambda a: np.ascontiguousarray(a, dtype=np.float32)
        if dt == "BF16":
            return self._raw(name, np.uint16), gguf.bf16_to_f32
        return self._raw(name, np.float16), lambda a: a.astype(np.float32)

    def bf16_source(self, name):
        """(the stored array, a function turning a slice of it into bf16 bits):
        the stored bits when stored as bf16, else rounded to nearest even."""
        if self.dtype(name) == "BF16":
            return self._raw(name, np.uint16), np.ascontiguousarray
        src, to_f32 = self.f32_source(name)
        return src, lambda a: gguf.bf16_bits(to_f32(a))
