#!/usr/bin/python3
"""Scores a model file written by export_model (an MLP or a CNN) on the Fashion-MNIST test set,
with NumPy alone.

    /usr/bin/python3 tools/score_model.py model.safetensors [--data_dir=/usr/share/datasets/fashion-mnist]

prints "test loss L, accuracy A" for the same 10,000 images `evaluator --model_file` scores.
"""
import argparse
import gzip
import json
import re
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


def parse_cnn(spec):
    """The layers of a cnn:CxHxW-... spec (common/network_spec.h): ("conv", kernel, stride, pad),
    ("pool", window) and ("fc",) in order, and the input's (height, width, channels)."""
    parts = spec[len("cnn:"):].split("-")
    channels, height, width = (int(v) for v in parts[0].split("x"))
    layers = []
    for part in parts[1:]:
        if part.startswith("conv"):
            m = re.fullmatch(r"conv(\d+)(?:k(\d+))?(?:s(\d+))?(?:p(\d+))?", part)
            kernel = int(m.group(2) or 3)
            pad = int(m.group(4)) if m.group(4) is not None else kernel // 2
            layers.append(("conv", kernel, int(m.group(3) or 1), pad))
        elif part.startswith("pool"):
            layers.append(("pool", int(part[len("pool"):])))
        else:
            layers.append(("fc",))
    return (height, width, channels), layers


def conv(x, weight, bias, stride, pad):
    """NHWC convolution, weight [K, K, C_in, C_out]: every output pixel's window, ordered
    (ky, kx, c), times the weight as a [K*K*C_in, C_out] matrix (the shards' layout)."""
    k = weight.shape[0]
    x = np.pad(x, ((0, 0), (pad, pad), (pad, pad), (0, 0)))
    windows = np.lib.stride_tricks.sliding_window_view(x, (k, k), axis=(1, 2))[:, ::stride, ::stride]
    n, oh, ow, c = windows.shape[:4]
    cols = windows.transpose(0, 1, 2, 4, 5, 3).reshape(n * oh * ow, k * k * c)
    return (cols @ weight.reshape(k * k * c, -1) + bias).reshape(n, oh, ow, -1)


def forward(model, tensors, x):
    """Logits of the model named in the file's metadata for the rows of x ([n, 784], in [0, 1]).
    fc<l>.weight is [in, out]: a dense layer computes x @ W + b; ReLU after every layer but the
    last and but pooling."""
    if model.startswith("cnn:"):
        (height, width, channels), layers = parse_cnn(model)
        x = x.reshape(len(x), height, width, channels)
    else:
        layers = [("fc",)] * sum(1 for name in tensors if name.endswith(".weight"))
    convs = dense = 0
    for i, layer in enumerate(layers):
        if layer[0] == "conv":
            convs += 1
            x = np.maximum(conv(x, tensors[f"conv{convs}.weight"], tensors[f"conv{convs}.bias"],
                                layer[2], layer[3]), 0)
        elif layer[0] == "pool":
            p = layer[1]
            n, h, w, c = x.shape
            x = x[:, : h // p * p, : w // p * p].reshape(n, h // p, p, w // p, p, c).max(axis=(2, 4))
        else:
            dense += 1
            x = x.reshape(len(x), -1) @ tensors[f"fc{dense}.weight"] + tensors[f"fc{dense}.bias"]
            if i + 1 < len(layers):
                x = np.maximum(x, 0)
    return x


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("model_file")
    parser.add_argument("--data_dir", default="/usr/share/datasets/fashion-mnist")
    args = parser.parse_args()

    tensors, metadata = load_safetensors(args.model_file)
    images = load_idx(f"{args.data_dir}/t10k-images-idx3-ubyte.gz")
    labels = load_idx(f"{args.data_dir}/t10k-labels-idx1-ubyte.gz").astype(np.int64)
    x = images.reshape(len(images), -1).astype(np.float32) / np.float32(255)

    logits = np.concatenate([forward(metadata["model"], tensors, x[i : i + 500])
                             for i in range(0, len(x), 500)]).astype(np.float64)
    shifted = logits - logits.max(axis=1, keepdims=True)
    log_probs = shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True))
    loss = -log_probs[np.arange(len(labels)), labels].mean()
    accuracy = (logits.argmax(axis=1) == labels).mean()
    print(f"{metadata['model']} versions {metadata['versions']}: "
          f"test loss {loss:.6f}, accuracy {accuracy:.4f}")


if __name__ == "__main__":
    main()
