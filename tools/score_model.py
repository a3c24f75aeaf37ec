#!/usr/bin/env python3
"""Scores a model file written by export_model on the Fashion-MNIST test set, with NumPy alone.

    python3 tools/score_model.py model.safetensors [--data_dir=/usr/share/datasets/fashion-mnist]

prints "test loss L, accuracy A" for the same 10,000 images `evaluator --model_file` scores.
"""
import argparse
import gzip
import json
import struct

import numpy as np


def load_safetensors(path):
    """Returns ({name: float32 array}, metadata) of a safetensors file: an 8-byte little-endian
    header length, a JSON header (dtype, shape, data_offsets of each tensor; "__metadata__"), then
    the raw little-endian tensors."""
    with open(path, "rb") as f:
        data = f.read()
    (header_length,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8 : 8 + header_length])
    metadata = header.pop("__metadata__", {})
    tensors = {}
    for name, entry in header.items():
        assert entry["dtype"] == "F32", f"{name}: {entry['dtype']}"
        begin, end = entry["data_offsets"]
        tensors[name] = np.frombuffer(
            data, dtype="<f4", count=(end - begin) // 4, offset=8 + header_length + begin
        ).reshape(entry["shape"])
    return tensors, metadata


def load_idx(path):
    """An IDX file (gzip-compressed) of unsigned bytes as an array of its dimensions."""
    with gzip.open(path, "rb") as f:
        data = f.read()
    rank = data[3]
    dims = struct.unpack(f">{rank}I", data[4 : 4 + 4 * rank])
    return np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * rank).reshape(dims)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("model_file")
    parser.add_argument("--data_dir", default="/usr/share/datasets/fashion-mnist")
    args = parser.parse_args()

    tensors, metadata = load_safetensors(args.model_file)
    images = load_idx(f"{args.data_dir}/t10k-images-idx3-ubyte.gz")
    labels = load_idx(f"{args.data_dir}/t10k-labels-idx1-ubyte.gz").astype(np.int64)
    x = images.reshape(len(images), -1).astype(np.float32) / np.float32(255)

    # fc<l>.weight is [in, out]: each layer computes x @ W + b, ReLU between layers.
    layers = sum(1 for name in tensors if name.endswith(".weight"))
    for l in range(1, layers + 1):
        x = x @ tensors[f"fc{l}.weight"] + tensors[f"fc{l}.bias"]
        if l < layers:
            x = np.maximum(x, 0)

    logits = x.astype(np.float64)
    shifted = logits - logits.max(axis=1, keepdims=True)
    log_probs = shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True))
    loss = -log_probs[np.arange(len(labels)), labels].mean()
    accuracy = (logits.argmax(axis=1) == labels).mean()
    print(f"{metadata['model']} versions {metadata['versions']}: "
          f"test loss {loss:.6f}, accuracy {accuracy:.4f}")


if __name__ == "__main__":
    main()
