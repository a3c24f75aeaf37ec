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
    tensors = {}  # in the file's data order: the flat vector's
    for name, entry in sorted(header.items(), key=lambda item: item[1]["data_offsets"]):
        if entry.get("dtype") != "F32":
            raise invalid(f"{path}: tensor {name} is {entry.get('dtype')}, expected F32")
        begin, end = entry["data_offsets"]
        tensors[name] = np.frombuffer(data, "<f4", (end - begin) // 4,
                                      8 + n + begin).reshape(entry["shape"]).copy()
    return tensors, metadata


def load_file(path):
    """The file's tensors by name, as float32 NumPy arrays (safetensors.numpy.load_file's
    interface)."""
    return read_file(path)[0]
