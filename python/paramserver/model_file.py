"""Reading the safetensors files this system writes (export_model, psctl export, shard
checkpoints) with NumPy alone: no `safetensors` package needed. The file's CRC-32 (metadata
"file_crc32", over the whole file with those 8 digits written as zeros) is checked, so a torn or
edited file is refused rather than loaded."""
import json
import struct
import zlib

import numpy as np

from .errors import invalid

_CRC_KEY = b'"file_crc32":"'


def read_file(path):
    """(tensors, metadata) of the file: {name: float32 NumPy array of its shape} in the order of
    the data (an export's: the model's flat order), {key: text}."""
    with open(path, "rb") as f:
        data = f.read()
    if len(data) < 8:
        raise invalid(f"{path} is not a safetensors file (shorter than 8 bytes)")
    (n,) = struct.unpack("<Q", data[:8])
    if n > len(data) - 8:
        raise invalid(f"{path} is torn: its header says {n} bytes, the file has {len(data) - 8}")
    try:
        header = json.loads(data[8:8 + n])
    except ValueError as e:
        raise invalid(f"{path}: the safetensors header is not JSON ({e})") from None
    metadata = header.pop("__metadata__", {})
    at = data.find(_CRC_KEY, 8, 8 + n)
    if "file_crc32" not in metadata or at < 0:
        raise invalid(f"{path} carries no file_crc32: not a file of this system")
    blanked = data[:at + len(_CRC_KEY)] + b"00000000" + data[at + len(_CRC_KEY) + 8:]
    if f"{zlib.crc32(blanked):08x}" != metadata["file_crc32"]:
        raise invalid(f"{path} is torn or corrupt (checksum mismatch)")
    try:
        return _tensors(header, data, 8 + n, path), metadata
    except (AttributeError, KeyError, TypeError, ValueError) as e:
        raise invalid(f"{path}: a malformed safetensors header ({type(e).__name__}: {e})") from None


def _tensors(header, data, start, path):
    """The tensors `header` describes in data[start:], in the data's order (the flat vector's)."""
    tensors = {}
    for name, entry in sorted(header.items(), key=lambda item: item[1]["data_offsets"]):
        if entry["dtype"] != "F32":
            raise invalid(f"{path}: tensor {name} is {entry['dtype']}, expected F32")
        begin, end = (int(v) for v in entry["data_offsets"])
        shape = [int(d) for d in entry["shape"]]
        if not 0 <= begin <= end <= len(data) - start or end - begin != 4 * int(np.prod(shape)):
            raise invalid(f"{path}: tensor {name}'s bytes [{begin}, {end}) do not hold shape "
                          f"{shape} inside the file")
        tensors[name] = np.frombuffer(data, "<f4", (end - begin) // 4,
                                      start + begin).reshape(shape).copy()
    return tensors


def load_file(path):
    """The file's tensors by name, as float32 NumPy arrays (safetensors.numpy.load_file's
    interface)."""
    return read_file(path)[0]
